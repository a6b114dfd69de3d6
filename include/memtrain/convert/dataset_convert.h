#pragma once
// A Medical Segmentation Decathlon / nnU-Net folder (dataset.json,
// imagesTr/, labelsTr/) to two ragged HDF5 volume files (docs/data-format.md
// "Cases of different shapes"): `memtrain convert-dataset`. Every case is
// reoriented to RAS (orientation.h), resampled to one spacing and
// normalised per channel. Documented in docs/data-convert.md. No LibTorch here.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace memtrain {

struct DatasetConvertSpec {
  std::string folder;  // holds dataset.json, imagesTr/, labelsTr/
  std::string out;     // PREFIX: writes PREFIX-train.h5 and PREFIX-val.h5
  double val_fraction = 0.2;  // without `splits`: the share of cases in val
  uint64_t seed = 0;          // the split's seed (convert-images' keys)
  std::string splits;         // nnU-Net splits_final.json ("": draw a split)
  int64_t fold = -1;          // with `splits`: the entry used
  std::string spacing;        // "" or "median", or "D,H,W" in mm
  int64_t chunk = 32;         // chunk edge (capped by each dimension)
  // "": case files without the NIfTI magic (Analyze 7.5) refused; else
  // their voxel axes' directions, e.g. "LAS" (check_axis_code)
  std::string analyze_orientation;
};

// One file written by convert_dataset.
struct DatasetFile {
  std::string path;
  std::string split;  // "train" or "val"
  int64_t cases = 0;
  int64_t channels = 1;
  std::array<int64_t, 3> max_shape{0, 0, 0};  // D, H, W of /volumes
  std::vector<std::string> case_names;
};

struct DatasetConvertResult {
  std::vector<DatasetFile> files;      // train, then val
  std::array<double, 3> spacing_mm{};  // D, H, W
  int64_t num_classes = 0;
  std::vector<std::string> class_names;
  int64_t test_cases = 0;   // cases in imagesTs/ (not converted)
  std::string test_folder;  // FOLDER/imagesTs ("" when absent)
};

// Reads spec.folder and writes both files, each atomically (a temporary
// file in the same folder, renamed when both are complete: on any error
// nothing is written). Throws memtrain::Error naming the case and the file
// (or the flag) on bad input; the rules are docs/data-convert.md's.
DatasetConvertResult convert_dataset(const DatasetConvertSpec& spec);

}  // namespace memtrain
