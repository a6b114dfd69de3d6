#pragma once
// Private to src/convert/: convert-dataset's cases (dataset_meta.cpp reads
// dataset.json, dataset_convert.cpp finds them and draws the split,
// dataset_write.cpp reads and writes them).

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "memtrain/convert/dataset_convert.h"
#include "memtrain/formats/nifti/orientation.h"

namespace memtrain {

// What dataset.json says (dataset_meta.cpp).
struct DatasetMeta {
  std::vector<std::string> class_names;  // by label value 0..K-1
  std::vector<std::string> channels;     // by channel 0..C-1
  std::string ending = ".nii.gz";
  nlohmann::json training;    // MSD's list of {"image", "label"} (null: none)
  int64_t num_training = -1;  // numTraining (-1: absent)
  int64_t num_test = -1;      // numTest (-1: absent)
  int64_t test_listed = -1;   // the length of MSD's "test" list (-1: none)
};

// FOLDER/dataset.json; throws memtrain::Error naming it and what is wrong
// (docs/data-convert.md "Input").
DatasetMeta read_dataset_meta(const std::string& folder);

// The JSON file `path` (`what` names it: "dataset.json", "--splits");
// throws memtrain::Error for a missing file, bad JSON or a key written
// twice in an object.
nlohmann::json read_dataset_json(
    const std::string& path, const std::string& what);

// numTraining against the `training_cases` found (the "training" list's,
// else imagesTr/'s) and numTest against the "test" list and the
// `imagests_cases` of imagesTs/ (-1: no such folder); an absent count is
// not checked. Throws memtrain::Error naming dataset.json, the field and
// both numbers.
void check_case_counts(
    const std::string& folder,
    const DatasetMeta& m,
    int64_t training_cases,
    int64_t imagests_cases);

struct DatasetCase {
  std::string name;
  std::vector<std::string> images;  // one per channel, or one 4D file
  bool single_file = false;         // MSD: images[0] holds every channel
  std::string label;
  // From the headers (read_case_header):
  std::array<int64_t, 3> source_shape{1, 1, 1};  // nx, ny, nz
  Affine source_affine = identity_affine();
  Orientation orientation;
  std::array<int64_t, 3> ras_shape_dhw{1, 1, 1};   // after reorientation
  std::array<double, 3> ras_spacing_dhw{1, 1, 1};  // mm
  std::array<int64_t, 3> out_shape{1, 1, 1};       // after resampling
  bool analyze = false;  // a file of it is Analyze 7.5 (no NIfTI magic)
};

// Opens the case's files' headers and fills the header fields; throws
// memtrain::Error naming the case and the file for a file that is not a
// NIfTI case of `channels` channels, image and label grids or transforms
// that differ, or a transform without an orientation. Analyze 7.5 files
// are read only with `analyze_orientation` (--analyze-orientation).
void read_case_header(
    DatasetCase* c, int64_t channels, const std::string& analyze_orientation);

// What both files share.
struct DatasetWriteCommon {
  int64_t channels = 1;
  int64_t num_classes = 2;
  std::string class_names;                 // comma-separated
  std::array<double, 3> spacing{1, 1, 1};  // target, D, H, W
  int64_t chunk = 32;
  std::string source;
  uint64_t seed = 0;
  double val_fraction = -1;  // < 0: a --fold split
  int64_t fold = -1;
  std::string analyze_orientation;  // --analyze-orientation
};

// Reads, reorients, resamples and normalises each case and writes
// OUT-train.h5 (cases[train]) and OUT-val.h5 (cases[val]), renamed into
// place only when both are complete.
std::vector<DatasetFile> write_dataset_files(
    const std::string& out,
    const std::vector<DatasetCase>& cases,
    const std::vector<size_t>& train,
    const std::vector<size_t>& val,
    const DatasetWriteCommon& common);

}  // namespace memtrain
