// torch.save files read without Python (torch_file.h), on files written by
// PyTorch 2.11 itself (tests/data/torch_files/make.py says what each
// holds), and model.pretrained_rename (model_state.h).

#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "memtrain/util/error.h"
#include "memtrain/weights/model_state.h"
#include "memtrain/weights/torch_file.h"
#include "test_support.h"

namespace memtrain {
namespace {

using test::error_of;

std::string fixture(const std::string& name) {
  return std::string(MEMTRAIN_TEST_DATA) + "/torch_files/" + name;
}

// state.pt's tensors, as make.py builds them.
void expect_state(const NamedTensors& t) {
  std::vector<std::string> names;
  for (const auto& [n, x] : t)
    names.push_back(n);
  EXPECT_EQ(
      names,
      (std::vector<std::string>{
          "lin.weight",
          "lin.bias",
          "bn.weight",
          "bn.bias",
          "bn.running_mean",
          "bn.running_var",
          "bn.num_batches_tracked",
          "half",
          "view",
          "empty"}));
  ASSERT_EQ(t.size(), 10u);
  const at::Tensor w = torch::arange(12, torch::kFloat).view({3, 4}) / 8;
  EXPECT_TRUE(torch::equal(t[0].second, w));
  EXPECT_TRUE(torch::equal(t[1].second, torch::tensor({-1.0f, 0.0f, 1.0f})));
  EXPECT_TRUE(torch::equal(t[2].second, torch::ones({2})));
  EXPECT_TRUE(torch::equal(t[3].second, torch::zeros({2})));
  EXPECT_TRUE(torch::equal(t[4].second, torch::zeros({2})));
  EXPECT_TRUE(torch::equal(t[5].second, torch::ones({2})));
  EXPECT_EQ(t[6].second.scalar_type(), at::kLong);
  EXPECT_EQ(t[6].second.dim(), 0);
  EXPECT_EQ(t[6].second.item<int64_t>(), 7);
  EXPECT_EQ(t[7].second.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(torch::equal(
      t[7].second, (torch::arange(4, torch::kFloat) / 4).to(at::kBFloat16)));
  // A view into lin.weight's storage: offset 5, strides (1, 4).
  EXPECT_TRUE(torch::equal(t[8].second, w.slice(0, 1).slice(1, 1).t()));
  EXPECT_EQ(t[9].second.sizes(), (std::vector<int64_t>{0, 3}));
}

TEST(TorchFile, StateDictOfAModuleWithItsDtypesViewsAndCounters) {
  EXPECT_TRUE(is_torch_file(fixture("state.pt")));
  EXPECT_TRUE(is_torch_file(fixture("legacy.pt")));
  const TorchWeights w = load_torch_weights(fixture("state.pt"));
  EXPECT_EQ(w.entry, "");
  expect_state(w.tensors);
}

TEST(TorchFile, PickleProtocol4ReadsAlike) {
  expect_state(load_torch_weights(fixture("proto4.pt")).tensors);
}

TEST(TorchFile, CheckpointsStateDictIsFoundUnderItsKey) {
  // Beside it: an optimizer's state (int keys, tuples, floats), bytes, a
  // class instance, an int past 64 bits: kept inert, not refused.
  const TorchWeights w = load_torch_weights(fixture("checkpoint.pt"));
  EXPECT_EQ(w.entry, "state_dict");
  expect_state(w.tensors);
}

TEST(TorchFile, WhatIsNotAStateDictIsRefusedNamingWhy) {
  EXPECT_NE(
      error_of([] { load_torch_weights(fixture("whole.pt")); })
          .find(
              "a pickled torch.nn.modules.linear.Linear (torch.save(model)?), "
              "not a state dict"),
      std::string::npos);
  EXPECT_NE(
      error_of([] {
        load_torch_weights(fixture("legacy.pt"));
      }).find("PyTorch's legacy format"),
      std::string::npos);
  EXPECT_NE(
      error_of([] {
        load_torch_weights(fixture("script.pt"));
      }).find("is a TorchScript archive (torch.jit.save)"),
      std::string::npos);
  EXPECT_NE(
      error_of([] { load_torch_weights(fixture("nodict.pt")); })
          .find("holds a dict with keys 'epoch', 'weights' that is not a state "
                "dict ('epoch' is an int, not a tensor)"),
      std::string::npos);
  EXPECT_NE(
      error_of([] {
        load_torch_weights(fixture("quant.pt"));
      }).find("tensor 'w' is made by torch._utils._rebuild_qtensor"),
      std::string::npos);
  // The first key checkpoints use holds a dict that is not one of tensors:
  // named, not passed over for the next.
  EXPECT_NE(
      error_of([] { load_torch_weights(fixture("badentry.pt")); })
          .find("its 'state_dict' is not a state dict: 'x' is None, not a "
                "tensor"),
      std::string::npos);
}

TEST(TorchFile, NegatedViewsReadAsTorchLoadGivesThemAndExtraStateIsSkipped) {
  const TorchWeights w = load_torch_weights(fixture("neg.pt"));
  ASSERT_EQ(w.tensors.size(), 1u);
  EXPECT_EQ(w.tensors[0].first, "w");
  EXPECT_TRUE(torch::equal(w.tensors[0].second, torch::tensor({-2.0f, 4.0f})));
}

TEST(TorchFile, LegacyFileThroughTheWeightsLoaderGetsTheResaveCommand) {
  torch::nn::Linear net(2, 2);
  const std::string m = error_of([&] {
    load_weights_file(*net, fixture("legacy.pt"), true, "model.pretrained");
  });
  EXPECT_NE(m.find("model.pretrained: '"), std::string::npos) << m;
  EXPECT_NE(m.find("PyTorch's legacy format"), std::string::npos) << m;
}

TEST(TorchFile, DeeplyNestedPickleIsRefusedWithoutExhaustingTheStack) {
  // A million nested tuples: no recursion in reading or freeing them.
  test::TempDir dir("tf");
  const std::string path = dir.file("deep.pt");
  {
    caffe2::serialize::PyTorchStreamWriter zip(path);
    const std::string pkl = "\x80\x02N" + std::string(1000000, '\x85') + ".";
    zip.writeRecord("data.pkl", pkl.data(), pkl.size());
    zip.writeEndOfFile();
  }
  EXPECT_NE(
      error_of([&] {
        load_torch_weights(path);
      }).find("holds a tuple, not a dict of tensors"),
      std::string::npos);
}

TEST(TorchFile, DamagedFilesAreRefusedNotRead) {
  test::TempDir dir("tf");
  std::ifstream in(fixture("state.pt"), std::ios::binary);
  const std::string bytes(
      (std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Cut anywhere past the zip magic: an error, never a crash or a tensor.
  for (const size_t cut : {size_t{10}, bytes.size() / 2, bytes.size() - 30}) {
    const std::string path = dir.file("cut.pt");
    std::ofstream(path, std::ios::binary) << bytes.substr(0, cut);
    EXPECT_NE(error_of([&] { load_torch_weights(path); }), "(no error)")
        << "cut at " << cut;
  }
  const std::string text = dir.file("text.pt");
  std::ofstream(text) << "not weights";
  EXPECT_NE(
      error_of([&] {
        load_torch_weights(text);
      }).find("neither a safetensors file nor a torch.save zip archive"),
      std::string::npos);
}

// PyTorch's miniz skips the CRC-32 of the records it reads
// (MINIZ_DISABLE_ZIP_READER_CRC32_CHECKS): each record memtrain reads is
// checked against its entry of the zip central directory.
TEST(TorchFile, RecordsAreCheckedAgainstTheZipDirectorysCrc) {
  test::TempDir dir("tf");
  std::ifstream in(fixture("state.pt"), std::ios::binary);
  const std::string good(
      (std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // lin.weight's storage, data/0: 12 floats stored as they are.
  const size_t at = caffe2::serialize::PyTorchStreamReader(fixture("state.pt"))
                        .getRecordOffset("data/0");
  const std::string path = dir.file("bad.pt");
  auto crc = [](const std::string& b) {
    char h[16];
    std::snprintf(
        h,
        sizeof(h),
        "0x%08lx",
        crc32(0, reinterpret_cast<const Bytef*>(b.data()), b.size()));
    return std::string(h);
  };
  std::string bad = good;
  bad[at + 5] ^= 1;
  std::ofstream(path, std::ios::binary) << bad;
  EXPECT_EQ(
      error_of([&] { load_torch_weights(path); }),
      "'" + path +
          "': zip record state/data/0 does not match its CRC-32 in the "
          "archive's central directory (" +
          crc(good.substr(at, 48)) + ", 48 bytes; its 48 bytes give " +
          crc(bad.substr(at, 48)) +
          "): the file is damaged; save it again with torch.save or "
          "re-download it");
  // The pickle too.
  bad = good;
  const size_t pkl = caffe2::serialize::PyTorchStreamReader(fixture("state.pt"))
                         .getRecordOffset("data.pkl");
  bad[pkl + 100] ^= 1;
  std::ofstream(path, std::ios::binary) << bad;
  EXPECT_NE(
      error_of([&] {
        load_torch_weights(path);
      }).find("': zip record state/data.pkl does not match its CRC-32"),
      std::string::npos);
  // A directory outside the file (ZIP64 end record's offset).
  bad = good;
  const size_t z64 = bad.rfind("PK\x06\x06");
  ASSERT_NE(z64, std::string::npos);
  bad[z64 + 48 + 7] = 0x7f;
  std::ofstream(path, std::ios::binary) << bad;
  EXPECT_NE(
      error_of([&] { load_torch_weights(path); })
          .find("': its zip central directory is malformed (the central "
                "directory (913 bytes at 9151314442816850616) is outside "
                "the file): not a torch.save file memtrain can read"),
      std::string::npos)
      << error_of([&] { load_torch_weights(path); });
}

TEST(PretrainedRename, RulesRenameInOrderAndRefuseMistakes) {
  NamedTensors t = {
      {"module.layers1.0.mlp.fc1.weight", torch::ones({1})},
      {"module.layers1.0.mlp.fc2.bias", torch::ones({1})},
      {"module.norm.weight", torch::ones({1})}};
  EXPECT_EQ(
      rename_tensors(
          t,
          {"^module\\. -> swinViT.", "\\.mlp\\.fc([12])\\. -> .mlp.linear$1."}),
      3);
  EXPECT_EQ(t[0].first, "swinViT.layers1.0.mlp.linear1.weight");
  EXPECT_EQ(t[1].first, "swinViT.layers1.0.mlp.linear2.bias");
  EXPECT_EQ(t[2].first, "swinViT.norm.weight");
  NamedTensors u = t;
  EXPECT_NE(
      error_of([&] {
        rename_tensors(u, {"^swinViT\\."});
      }).find("has no ' -> '"),
      std::string::npos);
  EXPECT_NE(
      error_of([&] {
        rename_tensors(u, {"([ -> x"});
      }).find("not a regular expression"),
      std::string::npos);
  EXPECT_NE(
      error_of([&] {
        rename_tensors(u, {"^decoder -> x"});
      }).find("matches no name of the file"),
      std::string::npos);
  EXPECT_NE(
      error_of([&] {
        rename_tensors(u, {"\\.linear[12]\\..*$ -> "});
      }).find("are both renamed to"),
      std::string::npos);
}

struct Net : torch::nn::Module {
  Net() {
    register_module("lin", torch::nn::Linear(4, 3));
    register_module("bn", torch::nn::BatchNorm1d(2));
  }
};

TEST(PretrainedRename, DataParallelFileLoadsThroughARuleAndIsExplainedWithout) {
  Net net;
  // No rule: nothing matches, which is an error even when not strict, with
  // the rule to add.
  EXPECT_NE(
      error_of([&] {
        load_weights_file(net, fixture("module.pt"), false, "model.pretrained");
      }).find("add model.pretrained_rename: ['^module\\. -> ']"),
      std::string::npos);
  const LoadReport r = load_weights_file(
      net, fixture("module.pt"), false, "model.pretrained", {"^module\\. -> "});
  EXPECT_EQ(r.renamed, 10);
  EXPECT_EQ(r.loaded.size(), 7u);
  EXPECT_EQ(r.unexpected, (std::vector<std::string>{"half", "view", "empty"}));
  const auto w = state_tensors(net);
  EXPECT_TRUE(torch::equal(
      w[0].second, torch::arange(12, torch::kFloat).view({3, 4}) / 8));
  EXPECT_EQ(w[6].second.item<int64_t>(), 7);
  EXPECT_EQ(
      r.lines("model.pretrained")[1],
      "model.pretrained: 10 names renamed by model.pretrained_rename");
  // A checkpoint's state dict is named in the report's first line.
  const LoadReport c = load_weights_file(
      net, fixture("checkpoint.pt"), false, "model.pretrained");
  EXPECT_EQ(
      c.lines("model.pretrained")[0],
      "model.pretrained: " + fixture("checkpoint.pt") +
          " ('state_dict'): 7 of 7 tensors loaded");
}

}  // namespace
}  // namespace memtrain
