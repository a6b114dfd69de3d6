#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "memtrain/util/error.h"
#include "memtrain/weights/safetensors.h"
#include "test_support.h"

namespace memtrain {
namespace {

TEST(Safetensors, RoundTripKeepsNamesShapesValuesAndMetadata) {
  test::TempDir dir("st");
  torch::manual_seed(0);
  NamedTensors in = {
      {"fc1.weight", torch::randn({3, 4})},
      {"fc1.bias", torch::randn({3})},
      {"steps", torch::tensor({7}, torch::kInt64)},
      {"scalar", torch::tensor(2.5)}};
  save_safetensors(dir.file("m.safetensors"), in, {{"producer", "memtrain"}});
  std::map<std::string, std::string> meta;
  const NamedTensors out = load_safetensors(dir.file("m.safetensors"), &meta);
  ASSERT_EQ(out.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i].first, in[i].first);
    EXPECT_TRUE(torch::equal(out[i].second, in[i].second)) << in[i].first;
  }
  EXPECT_EQ(meta.at("producer"), "memtrain");
  // The header is 8-byte aligned as the format asks.
  std::ifstream f(dir.file("m.safetensors"), std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST(Safetensors, TruncatedFileIsRefused) {
  test::TempDir dir("st");
  save_safetensors(dir.file("m.safetensors"), {{"w", torch::ones({100})}});
  std::filesystem::resize_file(dir.file("m.safetensors"), 200);
  try {
    load_safetensors(dir.file("m.safetensors"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos)
        << e.what();
  }
}

TEST(Safetensors, FailedWriteLeavesOldFile) {
  test::TempDir dir("st");
  const std::string path = dir.file("m.safetensors");
  save_safetensors(path, {{"w", torch::ones({4})}});
  EXPECT_THROW(
      save_safetensors(
          path, {{"w", torch::zeros({4})}, {"w", torch::zeros({4})}}),
      Error);
  const NamedTensors back = load_safetensors(path);
  EXPECT_TRUE(torch::equal(back.at(0).second, torch::ones({4})));
}

// A header key written twice, a tensor's name or a field of its entry:
// JSON keeps the last silently; the safetensors library refuses both.
TEST(Safetensors, KeyTwiceInTheHeaderIsRefused) {
  test::TempDir dir("st");
  const std::string path = dir.file("m.safetensors");
  auto write = [&](const std::string& header) {
    std::ofstream f(path, std::ios::binary);
    const uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header << std::string(16, '\0');
  };
  const std::string a =
      R"({"dtype": "F32", "shape": [4], "data_offsets": [0, 16]})";
  write("{\"a\": " + a + ", \"a\": " + a + "}");
  EXPECT_EQ(
      test::error_of([&] { load_safetensors(path); }),
      "safetensors: '" + path +
          "' names tensor 'a' twice in its header; the file is damaged");
  write(R"({"a": {"dtype": "F32", "shape": [4], "shape": [2, 2],)"
        R"( "data_offsets": [0, 16]}})");
  EXPECT_EQ(
      test::error_of([&] { load_safetensors(path); }),
      "safetensors: '" + path +
          "' header: .a has key 'shape' twice; the file is damaged");
}

}  // namespace
}  // namespace memtrain
