#include <CLI/CLI.hpp>

#include <cstdio>

#include "commands.h"
#include "memtrain/data/synthetic/synthetic.h"
#include "memtrain/util/atomic_file.h"

namespace memtrain::cli {
namespace {
SyntheticSpec spec;
std::string out_path;
CLI::Option* samples_opt = nullptr;
CLI::Option* classes_opt = nullptr;
CLI::Option* context_opt = nullptr;
}  // namespace

void add_make_data(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "make-data",
      "Write a synthetic HDF5 dataset with a learnable signal (fixed seed). "
      "Files made with the same --seed share one task; --split draws other "
      "samples of it (make train and val with --split train / --split val).");
  cmd->add_option(
         "--kind",
         spec.kind,
         "features, images, volumes, fewshot (/features of many classes "
         "with few samples each; default 64 classes x 20), pairs "
         "(/features_a and /features_b sharing a latent vector per row), "
         "captions (uint8 RGB /images of --height x --width and int32 "
         "/tokens [N, 77] shaped like CLIP's: 49406, 1-75 random ids below "
         "49406, 49407, zeros; pixels independent of the tokens: for "
         "measuring model.name: clip's memory and time, nothing to learn), "
         "patch-features (/features rows of volumes' patch grids with "
         "/volume_ids and /voxel_index; default 2 classes, --context 16) or "
         "regression (/features and --targets float /targets linear in "
         "them)")
      ->check(CLI::IsMember(
          {"features",
           "images",
           "volumes",
           "fewshot",
           "pairs",
           "captions",
           "patch-features",
           "regression"}))
      ->capture_default_str();
  cmd->add_option("--out", out_path, "output file (.h5)")->required();
  samples_opt =
      cmd->add_option(
             "--samples", spec.samples, "number of samples (volumes: volumes)")
          ->check(CLI::PositiveNumber)
          ->capture_default_str();
  classes_opt = cmd->add_option("--classes", spec.classes, "number of classes")
                    ->check(CLI::Range(int64_t{2}, int64_t{1} << 20))
                    ->capture_default_str();
  cmd->add_option("--features", spec.features, "features: F")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  context_opt =
      cmd->add_option(
             "--context",
             spec.context,
             "features, patch-features: F2 of /context_features; pairs: Fb "
             "of /features_b (0: --features)")
          ->check(CLI::NonNegativeNumber)
          ->capture_default_str();
  cmd->add_option("--targets", spec.targets, "regression: T of /targets")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--latent", spec.latent, "pairs: dimensions a and b share")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option(
         "--volumes",
         spec.volumes,
         "patch-features: volumes (--samples unused)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option(
         "--grid", spec.grid, "patch-features: grid edge G (G^3 rows a volume)")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}))
      ->capture_default_str();
  cmd->add_flag(
      "--shuffle",
      spec.shuffle,
      "patch-features: rows in a seeded random order, not volume by volume");
  cmd->add_flag(
      "--ragged",
      spec.ragged,
      "volumes: cases of different shapes, each axis 50-100% of D, H, W "
      "(the first case whole), with /volume_shapes (docs/data-format.md)");
  cmd->add_option("--depth", spec.depth, "volumes: D")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option(
         "--chunk",
         spec.chunk,
         "volumes: chunk edge in voxels (0: one chunk per volume)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--channels", spec.channels, "images, volumes: C")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--height", spec.height, "images, volumes, captions: H")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--width", spec.width, "images, volumes, captions: W")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option(
         "--dtype", spec.dtype, "images: float32, uint8; volumes: also int16")
      ->check(CLI::IsMember({"float32", "uint8", "int16"}))
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
  if (spec.kind == "fewshot") {
    if (classes_opt->count() == 0)
      spec.classes = 64;
    if (samples_opt->count() == 0)
      spec.samples = spec.classes * 20;
  }
  if (spec.kind == "patch-features") {
    if (classes_opt->count() == 0)
      spec.classes = 2;
    if (context_opt->count() == 0)
      spec.context = 16;
    spec.samples = spec.volumes * spec.grid * spec.grid * spec.grid;
  }
  make_synthetic(spec, out_path);
  if (spec.kind == "regression") {
    std::printf(
        "wrote %s: %ld rows of %ld features, %ld targets, seed %lu, split "
        "%s\n",
        out_path.c_str(),
        static_cast<long>(spec.samples),
        static_cast<long>(spec.features),
        static_cast<long>(spec.targets),
        static_cast<unsigned long>(spec.seed),
        spec.split.c_str());
    return 0;
  }
  if (spec.kind == "captions") {
    std::printf(
        "wrote %s: %ld pairs of %ldx%ld RGB images and 77 tokens, seed %lu, "
        "split %s\n",
        out_path.c_str(),
        static_cast<long>(spec.samples),
        static_cast<long>(spec.height),
        static_cast<long>(spec.width),
        static_cast<unsigned long>(spec.seed),
        spec.split.c_str());
    return 0;
  }
  if (spec.kind == "pairs") {
    std::printf(
        "wrote %s: %ld pairs, latent %ld, seed %lu, split %s\n",
        out_path.c_str(),
        static_cast<long>(spec.samples),
        static_cast<long>(spec.latent),
        static_cast<unsigned long>(spec.seed),
        spec.split.c_str());
    return 0;
  }
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
