#include <CLI/CLI.hpp>

#include <cstdio>

#include "commands.h"
#include "memtrain/data/synthetic.h"
#include "memtrain/util/atomic_file.h"

namespace memtrain::cli {
namespace {
SyntheticSpec spec;
std::string out_path;
}  // namespace

void add_make_data(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "make-data",
      "Write a synthetic HDF5 dataset with a learnable signal (fixed seed). "
      "Files made with the same --seed share one task; --split draws other "
      "samples of it (make train and val with --split train / --split val).");
  cmd->add_option("--kind", spec.kind, "features or images")
      ->check(CLI::IsMember({"features", "images"}))
      ->capture_default_str();
  cmd->add_option("--out", out_path, "output file (.h5)")->required();
  cmd->add_option("--samples", spec.samples, "number of samples")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--classes", spec.classes, "number of classes")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--features", spec.features, "features: F")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--channels", spec.channels, "images: C")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--height", spec.height, "images: H")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--width", spec.width, "images: W")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--dtype", spec.dtype, "images: float32 or uint8")
      ->check(CLI::IsMember({"float32", "uint8"}))
      ->capture_default_str();
  cmd->add_option("--noise", spec.noise, "noise standard deviation")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--seed", spec.seed, "task seed")->capture_default_str();
  cmd->add_option("--split", spec.split, "sample draw (train, val, ...)")
      ->capture_default_str();
}

int run_make_data() {
  const auto slash = out_path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) {
    make_directories(out_path.substr(0, slash));
  }
  make_synthetic(spec, out_path);
  std::printf(
      "wrote %s: %ld %s samples, %ld classes, seed %lu, split %s\n",
      out_path.c_str(),
      static_cast<long>(spec.samples),
      spec.kind.c_str(),
      static_cast<long>(spec.classes),
      static_cast<unsigned long>(spec.seed),
      spec.split.c_str());
  return 0;
}

}  // namespace memtrain::cli
