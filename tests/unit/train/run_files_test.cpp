// The files a run keeps: checkpoints whose checksum covers every byte that
// decides a resume (an edited position is refused), the learning-rate
// schedule as a function of the window, and output folders a fresh run may
// not take over.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "memtrain/train/run_files/checkpoint.h"
#include "memtrain/train/run_files/output_dir.h"
#include "memtrain/train/state/lr_schedule.h"
#include "memtrain/util/error.h"
#include "test_support.h"

namespace memtrain {
namespace {

Checkpoint small_checkpoint() {
  Checkpoint c;
  c.state.step = 12;
  c.state.epoch = 1;
  c.state.epoch_samples = 64;
  c.state.epoch_loss_sum = 3.25;
  c.state.world_size = 2;
  c.state.effective_batch = 32;
  c.state.model = "mlp";
  c.state.config_yaml = "training:\n  lr: 0.05\n";
  c.state.loss_scale = 1024.0;
  c.state.scaler_good_steps = 7;
  c.state.scaler_skipped = 1;
  c.state.best_metric = "val_accuracy";
  c.state.best_value = 0.75;
  c.state.best_step = 8;
  c.params = {
      {"fc.weight", torch::arange(6, torch::kFloat32).reshape({2, 3})},
      {"fc.bias", torch::ones({2})}};
  c.optimizer = "optimizer-archive-bytes";
  c.rng = {torch::arange(8, torch::kUInt8), torch::arange(8, torch::kUInt8)};
  return c;
}

// The file's safetensors header (JSON) and the bytes after it.
struct RawFile {
  nlohmann::json header;
  std::string data;
};

RawFile read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string h(n, '\0');
  in.read(h.data(), static_cast<std::streamsize>(n));
  std::stringstream rest;
  rest << in.rdbuf();
  return {nlohmann::json::parse(h), rest.str()};
}

void write_raw(const std::string& path, const RawFile& f) {
  std::string h = f.header.dump();
  while (h.size() % 8)
    h += ' ';
  const uint64_t n = h.size();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << h << f.data;
}

void expect_refused(const std::string& path, const std::string& what) {
  try {
    load_checkpoint(path);
    ADD_FAILURE() << "accepted a checkpoint with " << what << " edited";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("corrupt or was edited"), std::string::npos)
        << what << ": " << e.what();
  }
}

TEST(CheckpointFile, RoundTripsEveryField) {
  test::TempDir dir("ckfile");
  save_checkpoint(dir.file("c.safetensors"), small_checkpoint());
  const Checkpoint c = load_checkpoint(dir.file("c.safetensors"));
  EXPECT_TRUE(c.metadata_checked);
  EXPECT_EQ(c.state.step, 12);
  EXPECT_EQ(c.state.epoch_samples, 64);
  EXPECT_EQ(c.state.epoch_loss_sum, 3.25);
  EXPECT_EQ(c.state.loss_scale, 1024.0);
  EXPECT_EQ(c.state.best_metric, "val_accuracy");
  EXPECT_EQ(c.state.best_value, 0.75);
  EXPECT_EQ(c.state.best_step, 8);
  EXPECT_EQ(c.optimizer, "optimizer-archive-bytes");
  ASSERT_EQ(c.rng.size(), 2u);
}

// Every metadata field (position, world size, scaler, config, best) edited
// by hand, one at a time: the file is refused. So are a tensor's shape,
// dtype and one byte of its data.
TEST(CheckpointFile, AnEditedFieldIsRefused) {
  test::TempDir dir("ckedit");
  const std::string path = dir.file("c.safetensors");
  save_checkpoint(path, small_checkpoint());
  const RawFile good = read_raw(path);
  int edited = 0;
  for (const auto& [key, value] : good.header["__metadata__"].items()) {
    if (key == "checksum" || key == "format")
      continue;
    RawFile f = good;
    std::string v = value.get<std::string>();
    v = v.empty() ? "1"
                  : (v.back() == '1' ? v.substr(0, v.size() - 1) + "2"
                                     : v.substr(0, v.size() - 1) + "1");
    f.header["__metadata__"][key] = v;
    write_raw(path, f);
    expect_refused(path, key);
    ++edited;
  }
  EXPECT_EQ(edited, 15);  // step, epoch, epoch_samples, ... best_step
  {
    RawFile f = good;  // [2, 3] -> [3, 2]: the same bytes
    f.header["model/fc.weight"]["shape"] = {3, 2};
    write_raw(path, f);
    expect_refused(path, "a shape");
  }
  {
    RawFile f = good;  // float32 -> int32: the same size
    f.header["model/fc.weight"]["dtype"] = "I32";
    write_raw(path, f);
    expect_refused(path, "a dtype");
  }
  {
    RawFile f = good;
    f.data[f.header["model/fc.bias"]["data_offsets"][0].get<size_t>()] ^= 1;
    write_raw(path, f);
    expect_refused(path, "a tensor byte");
  }
  write_raw(path, good);  // unedited: still loads
  EXPECT_EQ(load_checkpoint(path).state.step, 12);
}

TEST(LrSchedule, WarmupThenConstantCosineAndPoly) {
  TrainingConfig t;
  t.lr = 0.1;
  t.warmup_windows = 4;
  for (int64_t s = 0; s < 4; ++s)
    EXPECT_DOUBLE_EQ(lr_at(t, s, 20), 0.1 * double(s + 1) / 4.0);
  EXPECT_DOUBLE_EQ(lr_at(t, 4, 20), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(t, 19, 20), 0.1);  // constant

  t.lr_schedule = LrSchedule::kCosine;
  t.min_lr = 0.01;
  // After warmup, t = (s - 4) / 16: PyTorch's CosineAnnealingLR(T_max=16).
  EXPECT_DOUBLE_EQ(lr_at(t, 4, 20), 0.1);
  EXPECT_NEAR(lr_at(t, 12, 20), 0.055, 1e-15);  // half way: the mean
  EXPECT_NEAR(
      lr_at(t, 19, 20),
      0.01 + 0.09 * 0.5 * (1.0 + std::cos(M_PI * 15.0 / 16.0)),
      1e-15);
  EXPECT_DOUBLE_EQ(lr_at(t, 40, 20), 0.01);  // past the end: min_lr

  t.lr_schedule = LrSchedule::kPoly;
  t.min_lr = 0.0;
  t.warmup_windows = 0;
  t.poly_power = 1.0;  // linear: PolynomialLR(total_iters=10, power=1)
  for (int64_t s = 0; s < 10; ++s)
    EXPECT_NEAR(lr_at(t, s, 10), 0.1 * (1.0 - double(s) / 10.0), 1e-15);
  t.poly_power = 0.9;
  EXPECT_NEAR(lr_at(t, 5, 10), 0.1 * std::pow(0.5, 0.9), 1e-15);
}

TEST(OutputDir, AFreshRunIntoAUsedFolderIsRefusedWithTheWaysOut) {
  test::TempDir dir("outdir");
  const std::string d = dir.path();
  EXPECT_NO_THROW(check_output_dir(d + "/absent", false, false));
  EXPECT_NO_THROW(check_output_dir(d, false, false));  // empty
  std::ofstream(dir.file("metrics.jsonl"));            // empty: not a run
  std::ofstream(dir.file("rank-0.log")) << "x\n";      // logs: not a run
  EXPECT_TRUE(previous_run_files(d).empty());
  std::filesystem::create_directories(dir.file("checkpoints"));
  std::ofstream(dir.file("checkpoints/ckpt-00000004.safetensors")) << "x";
  std::ofstream(dir.file("metrics.jsonl")) << "{}\n";
  std::ofstream(dir.file("model.safetensors")) << "x";
  EXPECT_EQ(previous_run_files(d).size(), 3u);
  try {
    check_output_dir(d, false, false);
    ADD_FAILURE() << "a used folder was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(
        m.find("checkpoints/ckpt-00000004.safetensors"), std::string::npos);
    EXPECT_NE(m.find("--resume auto"), std::string::npos) << m;
    EXPECT_NE(m.find("--output.overwrite=true"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(check_output_dir(d, /*resuming=*/true, false));
  EXPECT_NO_THROW(check_output_dir(d, false, /*overwrite=*/true));
  std::filesystem::create_directories(dir.file("val/epoch-001"));
  std::ofstream(dir.file("val/epoch-001/case-000.png")) << "x";
  std::ofstream(dir.file("val/epoch-001/summary.json")) << "{}";
  std::filesystem::create_directories(dir.file("tb"));
  std::ofstream(dir.file("tb/events.out.tfevents.0000000001.memtrain.0000"));
  const auto gone = clear_previous_run(d);
  EXPECT_EQ(gone.size(), 6u);
  EXPECT_FALSE(std::filesystem::exists(dir.file("val/epoch-001")));
  EXPECT_TRUE(previous_run_files(d).empty());
  EXPECT_TRUE(std::filesystem::exists(dir.file("rank-0.log")));
}

}  // namespace
}  // namespace memtrain
