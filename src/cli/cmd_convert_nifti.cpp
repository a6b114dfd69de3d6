#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "commands.h"
#include "memtrain/convert/nifti_convert.h"
#include "memtrain/util/atomic_file.h"
#include "memtrain/util/error.h"

namespace memtrain::cli {
namespace {
ConvertSpec spec;
bool ignore_affine = false;
CLI::Option* resample_option = nullptr;
}  // namespace

void add_convert_nifti(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "convert-nifti",
      "Convert a NIfTI-1 image (.nii/.nii.gz, 3D, or 4D = channels) and its "
      "label volume into memtrain's HDF5 volume layout (/volumes + /masks, "
      "docs/data-format.md). With --split-axis, writes OUT-train.h5 and "
      "OUT-val.h5: two non-overlapping slabs. See docs/data-convert.md.");
  cmd->add_option("--image", spec.image, "image file (NIfTI-1)")->required();
  cmd->add_option("--labels", spec.labels, "label file (NIfTI-1, 3D)")
      ->required();
  cmd->add_option("--out", spec.out, "output file (.h5)")->required();
  cmd->add_option(
      "--split-axis",
      spec.split_axis,
      "x, y or z (NIfTI voxel axis): validation = the last planes");
  cmd->add_option(
         "--val-fraction",
         spec.val_fraction,
         "with --split-axis: fraction of planes for validation")
      ->capture_default_str();
  cmd->add_option(
      "--label-map",
      spec.label_map,
      "RULE:CLASS,... with RULE = V, A-B (inclusive) or >V; first match "
      "wins, unmatched voxels are class 0");
  cmd->add_option(
      "--class-names", spec.class_names, "comma-separated class names");
  resample_option = cmd->add_option(
      "--resample",
      spec.resample_mm,
      "isotropic voxel size in mm, > 0 (image trilinear, labels nearest)");
  cmd->add_option("--chunk", spec.chunk, "HDF5 chunk edge in voxels")
      ->capture_default_str();
  cmd->add_flag(
      "--ignore-affine",
      ignore_affine,
      "accept image and labels whose voxel-to-world transforms differ");
  cmd->add_option(
      "--analyze-orientation",
      spec.analyze_orientation,
      "accept Analyze 7.5 files (no NIfTI magic; refused without it) whose "
      "voxel axes i, j, k run toward these directions, e.g. LAS (nibabel's "
      "aff2axcodes)");
}

int run_convert_nifti() {
  spec.check_affine = !ignore_affine;
  // 0 is the library's "no resampling"; given, it is no voxel size.
  if (resample_option != nullptr && resample_option->count() > 0 &&
      spec.resample_mm == 0)
    throw Error(
        "convert-nifti: --resample 0 must be a positive voxel size in mm "
        "(finite, > 0)");
  const auto slash = spec.out.find_last_of('/');
  if (slash != std::string::npos && slash > 0) {
    make_directories(spec.out.substr(0, slash));
  }
  const std::vector<ConvertedFile> files = convert_nifti(spec);
  for (const ConvertedFile& f : files) {
    const auto& s = f.shape;
    std::printf(
        "wrote %s (%s): /volumes [%ld, %ld, %ld, %ld, %ld] float32, /masks "
        "uint8, spacing %g x %g x %g mm, %ld classes, voxels per class:",
        f.path.c_str(),
        f.split.c_str(),
        static_cast<long>(s[0]),
        static_cast<long>(s[1]),
        static_cast<long>(s[2]),
        static_cast<long>(s[3]),
        static_cast<long>(s[4]),
        f.spacing_mm[0],
        f.spacing_mm[1],
        f.spacing_mm[2],
        static_cast<long>(f.num_classes));
    for (size_t c = 0; c < f.class_voxels.size(); ++c) {
      const std::string name =
          c < f.class_names.size() ? f.class_names[c] : std::to_string(c);
      std::printf(
          "%s %s=%ld",
          c ? "," : "",
          name.c_str(),
          static_cast<long>(f.class_voxels[c]));
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace memtrain::cli
