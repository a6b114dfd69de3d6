#pragma once
// H5Dataset: one HDF5 file of samples and labels in memtrain's layout
// (data/FORMAT.md): `/features` [N, F] or `/images` [N, C, H, W], and
// `/labels` [N]. Opening validates the whole layout, so a bad file fails with
// a message naming the file and the dataset before training starts, never
// mid-epoch. No LibTorch here: reads go into caller-provided buffers.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace memtrain {

enum class SampleKind { kFeatures, kImages };

const char* to_string(SampleKind kind);

// "1.10.8": the HDF5 library this build runs with.
std::string hdf5_library_version();

struct DatasetInfo {
  std::string path;
  SampleKind kind = SampleKind::kFeatures;
  std::string sample_dataset;  // "/features" or "/images"
  std::string sample_dtype;    // as stored: "float32", "uint8", ...
  int64_t num_samples = 0;
  std::vector<int64_t> sample_shape;     // [F] or [C, H, W]
  int64_t num_classes = 0;               // root attribute, or max label + 1
  std::vector<std::string> class_names;  // may be empty
  std::vector<int64_t> label_counts;     // samples per class

  int64_t sample_numel() const;
};

class H5Dataset {
 public:
  // Opens `path` read-only and checks it against the layout. `role` names the
  // file's purpose in messages ("data.train"). Throws memtrain::Error naming
  // the file, the dataset and what was expected.
  static H5Dataset open(const std::string& path, const std::string& role);

  H5Dataset(H5Dataset&&) noexcept;
  H5Dataset& operator=(H5Dataset&&) noexcept;
  ~H5Dataset();

  const DatasetInfo& info() const {
    return info_;
  }

  // Reads the samples `indices` (any order; repeats allowed) into `x`
  // (indices.size() * sample_numel floats, row-major, in the order given)
  // and their labels into `y`. Integer sample types are converted to float
  // and normalised as data/FORMAT.md says. One hyperslab read per dataset:
  // only the requested rows are read. Blocking; not thread-safe on one
  // object.
  void read(const std::vector<int64_t>& indices, float* x, int64_t* y) const;

 private:
  struct Impl;
  explicit H5Dataset(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  DatasetInfo info_;
};

}  // namespace memtrain
