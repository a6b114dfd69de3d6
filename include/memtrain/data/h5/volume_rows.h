#pragma once
// Rows that belong to volumes (docs/data-format.md, "Rows that belong to
// volumes"): a /features file whose rows carry /volume_ids [N] and
// /voxel_index [N, 3], e.g. the patch-grid features of a frozen backbone
// with one label per patch. H5Dataset::open checks and reads both into
// DatasetInfo; this groups the rows by volume and writes a volume's
// prediction grid. No LibTorch, no hdf5.h here.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace memtrain {

struct DatasetInfo;

// The rows of a file grouped by volume. Built from DatasetInfo's
// row_volume_ids and row_voxel_index alone: rows may come in any order.
struct VolumeRowIndex {
  std::vector<int64_t> ids;                // distinct volume ids, ascending
  std::vector<std::vector<int64_t>> rows;  // rows of ids[v], ascending
  // Per volume: max voxel_index + 1 on each axis (d, h, w).
  std::vector<std::array<int64_t, 3>> extent;

  int64_t volumes() const {
    return static_cast<int64_t>(ids.size());
  }
  // Positions of volume v's grid (extent product).
  int64_t grid_voxels(int64_t v) const;
  // The linear position (d * H + h) * W + w of `row` in volume v's grid.
  int64_t grid_offset(
      int64_t v, const std::array<int64_t, 3>& voxel_index) const;
};

// Groups `info`'s rows (info.has_volume_rows must be true).
VolumeRowIndex index_volume_rows(const DatasetInfo& info);

// "8 volumes (ids 0..7), grids 6x6x6 (8)": the count, the id range and each
// distinct grid extent with how many volumes have it (at most 6 listed).
std::string describe_volume_rows(const VolumeRowIndex& index);

// Writes `path` atomically (an in-memory HDF5 image, then a temporary file
// renamed over `path`): `/prediction` [D, H, W] int16 (`grid`, row-major;
// -1 where the volume has no row), checksummed like make-data's datasets,
// with the attributes `volume_id` (int64) and `dice` (float64, NaN when no
// foreground class occurs in the labels or the prediction). Creates the
// folder. Throws memtrain::Error naming the path.
void write_volume_prediction(
    const std::string& path,
    int64_t volume_id,
    double dice,
    const std::array<int64_t, 3>& extent,
    const std::vector<int16_t>& grid);

}  // namespace memtrain
