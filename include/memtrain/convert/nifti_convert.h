#pragma once
// NIfTI-1 image + label volumes to memtrain's HDF5 volume layout
// (docs/data-format.md, `/volumes` + `/masks`): `memtrain convert-nifti`.
// Documented in docs/data-convert.md. No LibTorch here.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace memtrain {

struct ConvertSpec {
  std::string image;   // NIfTI-1 file (.nii, .nii.gz, .hdr/.img): 3D or 4D
  std::string labels;  // NIfTI-1 file, 3D, same grid as `image`
  std::string out;     // FILE.h5; with split_axis FILE-train.h5, FILE-val.h5
  std::string split_axis;     // "" (no split), "x", "y" or "z" (NIfTI axes)
  double val_fraction = 0.3;  // with split_axis: last round(f*n) planes = val
  std::string label_map;      // "RULE:CLASS,...", RULE = V | A-B | >V
  std::string class_names;    // "a,b,c" (optional): written as class_names
  double resample_mm = 0;     // > 0: isotropic output voxels of this size
                              // (0: none; the CLI refuses --resample 0)
  int64_t chunk = 32;         // chunk edge (clipped to each dimension)
  bool check_affine = true;   // refuse image/labels with other world transforms
  // "": Analyze 7.5 files (no NIfTI magic) refused; else their voxel axes'
  // directions, e.g. "LAS" (check_axis_code, nifti_volume.h)
  std::string analyze_orientation;
};

// One file written by convert_nifti.
struct ConvertedFile {
  std::string path;
  std::string split;                 // "all", "train" or "val"
  std::vector<int64_t> shape;        // /volumes: [1, C, D, H, W]
  std::array<double, 3> spacing_mm;  // [D, H, W]
  int64_t num_classes = 0;
  std::vector<int64_t> class_voxels;     // voxels of each class, num_classes
  std::vector<std::string> class_names;  // empty without --class-names
};

// Converts spec.image + spec.labels and writes the HDF5 file(s), each
// atomically (a temporary file in the same folder, renamed when complete; on
// error no output is touched). Returns what was written, in order (train
// before val). Throws memtrain::Error naming the file or the flag on bad
// input: missing or non-NIfTI file, unsupported datatype, grid mismatch, bad
// --label-map, --split-axis, --val-fraction, --resample or --chunk.
std::vector<ConvertedFile> convert_nifti(const ConvertSpec& spec);

}  // namespace memtrain
