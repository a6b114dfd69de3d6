#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "commands.h"
#include "memtrain/convert/dataset_convert.h"
#include "memtrain/util/atomic_file.h"

namespace memtrain::cli {
namespace {
DatasetConvertSpec spec;
}  // namespace

void add_convert_dataset(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "convert-dataset",
      "Convert a Medical Segmentation Decathlon / nnU-Net folder "
      "(dataset.json, imagesTr/, labelsTr/; NIfTI-1 or NIfTI-2) into two "
      "ragged HDF5 volume files, OUT-train.h5 and OUT-val.h5 "
      "(docs/data-format.md "
      "'Cases of different shapes'): each case reoriented to RAS, resampled "
      "to one spacing, z-scored per channel over its non-zero voxels. The "
      "split is drawn by case from --seed, or is a fold of an nnU-Net "
      "splits_final.json. See docs/data-convert.md.");
  cmd->add_option("--folder", spec.folder, "the dataset folder")->required();
  cmd->add_option(
         "--out", spec.out, "PREFIX: writes PREFIX-train.h5, PREFIX-val.h5")
      ->required();
  cmd->add_option(
         "--val-fraction",
         spec.val_fraction,
         "share of the cases for validation, in (0, 1)")
      ->capture_default_str();
  cmd->add_option("--seed", spec.seed, "seed of the split's draw")
      ->capture_default_str();
  cmd->add_option(
      "--splits",
      spec.splits,
      "nnU-Net splits_final.json (a list of {train: [...], val: [...]}); "
      "with --fold, instead of the drawn split");
  cmd->add_option("--fold", spec.fold, "with --splits: the fold used");
  cmd->add_option(
      "--spacing",
      spec.spacing,
      "target voxel size D,H,W in mm (RAS: D = S, H = A, W = R), or "
      "'median' (default): the per-axis median of the cases'");
  cmd->add_option("--chunk", spec.chunk, "HDF5 chunk edge in voxels")
      ->capture_default_str();
  cmd->add_option(
      "--analyze-orientation",
      spec.analyze_orientation,
      "accept case files without the NIfTI magic (Analyze 7.5; refused "
      "without it) whose voxel axes i, j, k run toward these directions, "
      "e.g. LAS (nibabel's aff2axcodes)");
}

int run_convert_dataset() {
  const auto slash = spec.out.find_last_of('/');
  if (slash != std::string::npos && slash > 0)
    make_directories(spec.out.substr(0, slash));
  const DatasetConvertResult r = convert_dataset(spec);
  std::string classes;
  for (size_t c = 0; c < r.class_names.size(); ++c)
    classes += (c ? "," : "") + r.class_names[c];
  for (const DatasetFile& f : r.files) {
    std::printf(
        "wrote %s (%s): %ld cases, /volumes [%ld, %ld, %ld, %ld, %ld] "
        "float32 (largest case %ld x %ld x %ld), RAS, spacing %g x %g x %g "
        "mm, %ld classes (%s)\n",
        f.path.c_str(),
        f.split.c_str(),
        static_cast<long>(f.cases),
        static_cast<long>(f.cases),
        static_cast<long>(f.channels),
        static_cast<long>(f.max_shape[0]),
        static_cast<long>(f.max_shape[1]),
        static_cast<long>(f.max_shape[2]),
        static_cast<long>(f.max_shape[0]),
        static_cast<long>(f.max_shape[1]),
        static_cast<long>(f.max_shape[2]),
        r.spacing_mm[0],
        r.spacing_mm[1],
        r.spacing_mm[2],
        static_cast<long>(r.num_classes),
        classes.c_str());
  }
  if (!r.test_folder.empty()) {
    std::printf(
        "%s: %ld test case(s), not converted; segment them with the trained "
        "weights: memtrain predict --config CONFIG --weights WEIGHTS "
        "--input %s --out OUT\n",
        r.test_folder.c_str(),
        static_cast<long>(r.test_cases),
        r.test_folder.c_str());
  }
  return 0;
}

}  // namespace memtrain::cli
