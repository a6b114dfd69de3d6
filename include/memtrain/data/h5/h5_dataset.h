#pragma once
// H5Dataset: one HDF5 file of samples and labels in memtrain's layout
// (docs/data-format.md): `/features` [N, F] (+ optional `/context_features`
// [N, F2]) or `/images` [N, C, H, W] with `/labels` [N], or `/volumes`
// [N, C, D, H, W] with `/masks` [N, D, H, W], or pairs: `/features_a` or
// `/images` with `/features_b` [N, Fb] or `/tokens` [N, L] and optional
// `/pair_ids` [N]. Opening
// validates the whole layout, so a bad file fails with a message naming the
// file and the dataset before training starts, never mid-epoch. No LibTorch
// here: reads go into caller-provided buffers.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace memtrain {

enum class SampleKind { kFeatures, kImages, kVolumes };

const char* to_string(SampleKind kind);

// "1.10.8": the HDF5 library this build runs with.
std::string hdf5_library_version();

struct DatasetInfo {
  std::string path;
  SampleKind kind = SampleKind::kFeatures;
  std::string sample_dataset;            // "/features", "/images" or "/volumes"
  std::string sample_dtype;              // as stored: "float32", "uint8", ...
  int64_t num_samples = 0;               // rows; volumes for /volumes files
  std::vector<int64_t> sample_shape;     // [F], [C, H, W] or [C, D, H, W]
  int64_t num_classes = 0;               // root attribute, or max label + 1
  std::vector<std::string> class_names;  // may be empty
  // Samples per class; voxels per class (all volumes) for /volumes files.
  std::vector<int64_t> label_counts;
  // /features and /images: every row's label (few-shot episodes draw rows
  // by class); empty for /volumes.
  std::vector<int64_t> row_labels;
  int64_t context_features = 0;  // F2 of /context_features; 0 without it
  // The most HDF5's chunk caches of the open datasets hold (a reader's
  // host memory, h5_util.h's chunk_cache_bound).
  int64_t chunk_cache_bytes = 0;
  // A pair file (docs/data-format.md, Pairs): the sample dataset is /features_a
  // or /images (tower a's input), context_features is the width Fb of
  // /features_b (tower b's input, read into read()'s `context`), the labels
  // are /pair_ids (without them, the row index), and num_classes is 0.
  bool paired = false;
  // A pair file of images and captions (docs/data-format.md, Pairs): tower b's
  // input is /tokens [N, L] (context_features is L), token ids read as
  // float (exact below 2^24) into read()'s `context`; token_max is the
  // largest id in the file, token_vocab its vocab_size attribute (0: none).
  bool tokens = false;
  int64_t token_max = 0;
  int64_t token_vocab = 0;
  // "/features_b" or "/tokens" (pairs), "/context_features" otherwise.
  std::string context_dataset() const;
  // A regression file (docs/data-format.md, "Targets"): /targets [N, T] float
  // holds every row's T targets instead of /labels; num_classes is 0 and
  // row_labels empty. 0: no /targets.
  int64_t targets = 0;
  // /volumes only: chunk shape [C, cd, ch, cw] (empty: contiguous), the
  // intensity normalisation in use, and the root attribute spacing_mm.
  std::vector<int64_t> chunk_shape;
  double scale = 1.0;
  double shift = 0.0;
  std::array<double, 3> spacing_mm{0, 0, 0};
  // /volumes only: the root attribute orientation ("RAS": convert-dataset
  // stored every case reoriented to RAS; "" when absent).
  std::string orientation;
  // Whether every dataset this reads has HDF5's Fletcher32 checksum (what
  // memtrain's writers add), so that damaged bytes fail the read instead of
  // training on; `unchecksummed` names those that have none ("/labels").
  bool checksummed = true;
  std::vector<std::string> unchecksummed;
  // /features files whose rows belong to volumes (docs/data-format.md, "Rows
  // that belong to volumes"): each row's /volume_ids entry and its
  // /voxel_index (d, h, w) in that volume's grid; empty without them.
  bool has_volume_rows = false;
  std::vector<int64_t> row_volume_ids;
  std::vector<std::array<int64_t, 3>> row_voxel_index;

  // /volumes only (docs/data-format.md, "Cases of different shapes"): each
  // case's own (d, h, w) inside the [D, H, W] of sample_shape -- from
  // /volume_shapes, else all [D, H, W] -- and, when the file names them,
  // each case's name (/case_names). `ragged`: some case is smaller.
  std::vector<std::array<int64_t, 3>> volume_shapes;
  std::vector<std::string> case_names;
  bool ragged = false;

  int64_t sample_numel() const;
  // Volumes: D * H * W (the voxels of one mask of the whole array).
  int64_t voxels() const;
  // Volumes: case v's (d, h, w), and its voxels d * h * w.
  const std::array<int64_t, 3>& volume_shape(int64_t v) const;
  int64_t volume_voxels(int64_t v) const;
  // "volume 3", or "volume 3 (la_003)" when the file names its cases.
  std::string volume_name(int64_t v) const;
};

struct OpenOptions {
  // Volumes: x = raw * intensity_scale + intensity_shift when
  // intensity_scale != 0, instead of the file's attributes.
  double intensity_scale = 0.0;
  double intensity_shift = 0.0;
};

class H5Dataset {
 public:
  // Opens `path` read-only and checks it against the layout. `role` names the
  // file's purpose in messages ("data.train"). Throws memtrain::Error naming
  // the file, the dataset and what was expected.
  static H5Dataset open(
      const std::string& path,
      const std::string& role,
      const OpenOptions& options = {});

  H5Dataset(H5Dataset&&) noexcept;
  H5Dataset& operator=(H5Dataset&&) noexcept;
  ~H5Dataset();

  const DatasetInfo& info() const {
    return info_;
  }

  // Reads the samples `indices` (any order; repeats allowed) into `x`
  // (indices.size() * sample_numel floats, row-major, in the order given)
  // and their labels into `y` (null for a file with /targets), (when not
  // null and the file has them) their context features into `context`
  // (indices.size() * F2) and their targets into `targets`
  // (indices.size() * T). Integer
  // sample types are converted to float and normalised as docs/data-format.md
  // says. One hyperslab read per dataset: only the requested rows are read.
  // For /volumes files, a row is the whole [D, H, W] array and `y` gets
  // its mask (D * H * W labels); a ragged file's cases are read with
  // read_volume() instead. Blocking; safe to call from several threads (HDF5
  // serialises inside the library). A chunk whose checksum does not match
  // throws memtrain::Error naming the file, the dataset and the rows.
  void read(
      const std::vector<int64_t>& indices,
      float* x,
      int64_t* y,
      float* context = nullptr,
      float* targets = nullptr) const;

  // Volumes: case `v` alone, its own [C, d, h, w] (volume_shape(v)) into
  // `x` and its [d, h, w] mask into `y`. Thread-safe like read().
  void read_volume(int64_t v, float* x, int64_t* y) const;

  // Volumes: reads the patch of `size` voxels at `corner` ([D, H, W]) of
  // volume `v` by hyperslab, into `x` (C * prod(size) floats) and its mask
  // into `y` (prod(size) labels). Never reads the rest of the volume (only
  // the chunks the patch touches). The part of the patch outside the case
  // (a corner below 0, or past volume_shape(v): a case smaller than the
  // patch) is image 0 and label 0. `y` nullptr: the labels are not read (a
  // context crop). Thread-safe like read(); a damaged chunk throws naming
  // the volume and the patch.
  void read_patch(
      int64_t v,
      const std::array<int64_t, 3>& corner,
      const std::array<int64_t, 3>& size,
      float* x,
      int64_t* y) const;

  // Volumes: linear voxel indices (within the case's own d*h*w grid) of
  // foreground voxels (mask > 0) of volume `v`, ascending; an evenly strided
  // subset of at most 65536 when there are more. Found on open.
  const std::vector<int64_t>& foreground(int64_t v) const;

  // Volumes: "" when the chunk layout suits patches of `patch` voxels;
  // otherwise a warning naming the file, the layout and the fix.
  std::string patch_layout_warning(const std::array<int64_t, 3>& patch) const;

  // "" when every dataset read has a checksum (DatasetInfo::checksummed);
  // otherwise one line naming the file and the datasets without one.
  std::string checksum_warning() const;

 private:
  struct Impl;
  explicit H5Dataset(std::unique_ptr<Impl> impl);
  // Pairs: /features_b and the optional /pair_ids (h5_pairs.cpp).
  static void open_pairs(
      Impl& impl, DatasetInfo& info, const std::string& where);
  // Regression: /targets in place of /labels (h5_dataset.cpp).
  static void open_targets(
      Impl& impl, DatasetInfo& info, const std::string& where);
  static void open_volumes(
      Impl& impl,
      DatasetInfo& info,
      const std::string& where,
      const OpenOptions& options);
  std::unique_ptr<Impl> impl_;
  DatasetInfo info_;
};

}  // namespace memtrain
