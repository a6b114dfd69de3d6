#include "memtrain/data/h5/volume_rows.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <tuple>

#include "data/h5/h5_read.h"
#include "data/h5/h5_volume_rows.h"
#include "data/h5/layout.h"
#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/util/atomic_file.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

// The most positions a volume's grid may span: validation builds each grid
// in host memory (int16 per position in the dump).
constexpr int64_t kMaxGridVoxels = int64_t{1} << 31;

std::string dims_text(const std::vector<hsize_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i)
    s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

// Opens the integer dataset `name` of `rows` rows (and `width` columns, 0:
// 1-D) and reads it whole as int64.
std::vector<int64_t> read_index_dataset(
    hid_t f,
    const char* name,
    int64_t rows,
    int64_t width,
    const std::string& where,
    DatasetInfo& info) {
  const std::string dw = where + " dataset '/" + name + "'";
  h5::Handle ds = h5::dataset(H5Dopen2(f, name, H5P_DEFAULT));
  MT_CHECK(
      ds.valid(), dw, ": cannot open (not a dataset?): ", h5::last_error());
  const auto dims = h5::dims_of(ds.get());
  const bool rank_ok =
      width == 0 ? dims.size() == 1
                 : dims.size() == 2 && dims[1] == static_cast<hsize_t>(width);
  MT_CHECK(
      rank_ok,
      dw,
      ": expected ",
      width == 0 ? "1-D [N]" : "2-D [N, 3]",
      ", found ",
      dims.size(),
      "-D ",
      dims_text(dims));
  MT_CHECK(
      h5::is_integer(ds.get()),
      dw,
      ": expected integer values, found ",
      h5::type_name(ds.get()));
  MT_CHECK(
      static_cast<int64_t>(dims[0]) == rows,
      dw,
      ": has ",
      dims[0],
      " rows but '",
      info.sample_dataset,
      "' has ",
      rows,
      "; they must be equal");
  std::vector<int64_t> values(rows * std::max<int64_t>(width, 1));
  h5::read_all(ds.get(), H5T_NATIVE_INT64, values.data());
  const auto neg = std::find_if(
      values.begin(), values.end(), [](int64_t v) { return v < 0; });
  if (neg != values.end()) {
    const int64_t at = neg - values.begin();
    throw Error(detail::concat(
        dw,
        ": value ",
        *neg,
        " at row ",
        width == 0 ? at : at / width,
        width == 0 ? "" : detail::concat(", axis ", at % width),
        " is negative; ",
        width == 0 ? "volume ids" : "voxel indices",
        " are >= 0"));
  }
  if (!h5::has_fletcher32(ds.get()))
    info.unchecksummed.push_back(std::string("/") + name);
  return values;
}

}  // namespace

void open_volume_rows(hid_t f, DatasetInfo& info, const std::string& where) {
  const bool has_ids = h5::has_link(f, layout::kVolumeIds);
  const bool has_voxels = h5::has_link(f, layout::kVoxelIndex);
  if (!has_ids && !has_voxels)
    return;
  MT_CHECK(
      info.kind == SampleKind::kFeatures,
      where,
      ": has ",
      layout::path(has_ids ? layout::kVolumeIds : layout::kVoxelIndex),
      " but holds ",
      info.sample_dataset,
      "; only /features files carry rows that belong to volumes (see "
      "docs/data-format.md)");
  MT_CHECK(
      has_ids && has_voxels,
      where,
      ": has ",
      has_ids ? "/volume_ids without /voxel_index"
              : "/voxel_index without /volume_ids",
      "; rows that belong to volumes need both (/volume_ids [N] and "
      "/voxel_index [N, 3], see docs/data-format.md)");
  const int64_t n = info.num_samples;
  std::vector<int64_t> ids =
      read_index_dataset(f, layout::kVolumeIds, n, 0, where, info);
  const std::vector<int64_t> flat =
      read_index_dataset(f, layout::kVoxelIndex, n, 3, where, info);
  std::vector<std::array<int64_t, 3>> voxels(n);
  for (int64_t i = 0; i < n; ++i)
    voxels[i] = {flat[3 * i], flat[3 * i + 1], flat[3 * i + 2]};

  // Each (volume, voxel) position once: rows sorted by position, equal
  // neighbours are a repeat. The same pass bounds each volume's grid.
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), int64_t{0});
  const auto key = [&](int64_t r) {
    return std::tie(ids[r], voxels[r][0], voxels[r][1], voxels[r][2]);
  };
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return key(a) < key(b) || (key(a) == key(b) && a < b);
  });
  const std::string vw = where + " dataset '/voxel_index'";
  std::array<int64_t, 3> extent{0, 0, 0};
  for (int64_t k = 0; k < n; ++k) {
    const int64_t r = order[k];
    if (k > 0 && key(order[k - 1]) == key(r)) {
      throw Error(detail::concat(
          vw,
          ": rows ",
          order[k - 1],
          " and ",
          r,
          " are both volume ",
          ids[r],
          ", voxel [",
          voxels[r][0],
          ",",
          voxels[r][1],
          ",",
          voxels[r][2],
          "]; each position of a volume is given once"));
    }
    for (int a = 0; a < 3; ++a)
      extent[a] = std::max(extent[a], voxels[r][a] + 1);
    if (k + 1 == n || ids[order[k + 1]] != ids[r]) {
      const double positions =
          static_cast<double>(extent[0]) * extent[1] * extent[2];
      MT_CHECK(
          positions <= static_cast<double>(kMaxGridVoxels),
          vw,
          ": volume ",
          ids[r],
          " spans a grid of ",
          extent[0],
          " x ",
          extent[1],
          " x ",
          extent[2],
          " positions (max voxel_index + 1 per axis), more than 2^31; "
          "validation builds each volume's grid in host memory");
      extent = {0, 0, 0};
    }
  }
  info.has_volume_rows = true;
  info.row_volume_ids = std::move(ids);
  info.row_voxel_index = std::move(voxels);
}

int64_t VolumeRowIndex::grid_voxels(int64_t v) const {
  return extent[v][0] * extent[v][1] * extent[v][2];
}

int64_t VolumeRowIndex::grid_offset(
    int64_t v, const std::array<int64_t, 3>& voxel_index) const {
  return (voxel_index[0] * extent[v][1] + voxel_index[1]) * extent[v][2] +
         voxel_index[2];
}

VolumeRowIndex index_volume_rows(const DatasetInfo& info) {
  MT_INTERNAL_ASSERT(
      info.has_volume_rows &&
          info.row_volume_ids.size() == info.row_voxel_index.size(),
      "index_volume_rows: the file has no volume rows");
  const auto& ids = info.row_volume_ids;
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return ids[a] < ids[b];
  });
  VolumeRowIndex out;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t r = order[k];
    if (out.ids.empty() || out.ids.back() != ids[r]) {
      out.ids.push_back(ids[r]);
      out.rows.emplace_back();
      out.extent.push_back({0, 0, 0});
    }
    out.rows.back().push_back(r);
    for (int a = 0; a < 3; ++a) {
      out.extent.back()[a] =
          std::max(out.extent.back()[a], info.row_voxel_index[r][a] + 1);
    }
  }
  return out;
}

std::string describe_volume_rows(const VolumeRowIndex& index) {
  std::map<std::array<int64_t, 3>, int64_t> grids;
  for (const auto& e : index.extent)
    ++grids[e];
  std::string s = detail::concat(index.volumes(), " volume(s)");
  if (index.volumes() > 0)
    s += detail::concat(
        " (ids ", index.ids.front(), "..", index.ids.back(), ")");
  s += ", grid(s)";
  int listed = 0;
  for (const auto& [e, count] : grids) {
    if (listed++ == 6) {
      s += detail::concat(" ... (", grids.size(), " sizes)");
      break;
    }
    s += detail::concat(" ", e[0], "x", e[1], "x", e[2], " (", count, ")");
  }
  return s;
}

void write_volume_prediction(
    const std::string& path,
    int64_t volume_id,
    double dice,
    const std::array<int64_t, 3>& extent,
    const std::vector<int16_t>& grid) {
  MT_INTERNAL_ASSERT(
      static_cast<int64_t>(grid.size()) == extent[0] * extent[1] * extent[2],
      "write_volume_prediction: grid size");
  h5::silence_errors();
  // The file is built in memory (HDF5's core driver, no backing store) and
  // published with write_file_atomically: a reader never sees half a file.
  h5::Handle fapl = h5::plist(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_fapl_core(fapl.get(), 1 << 20, /*backing_store=*/0);
  std::vector<char> image;
  {
    h5::Handle file = h5::file(
        H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
    MT_CHECK(
        file.valid(),
        "validation.dump_predictions: cannot create '",
        path,
        "' in memory: ",
        h5::last_error());
    h5::write_dataset(
        file.get(),
        layout::kPrediction,
        H5T_STD_I16LE,
        H5T_NATIVE_INT16,
        {hsize_t(extent[0]), hsize_t(extent[1]), hsize_t(extent[2])},
        {},
        grid.data());
    h5::write_attr(file.get(), layout::kVolumeId, volume_id);
    h5::write_attr(file.get(), layout::kDice, dice);
    MT_CHECK(
        H5Fflush(file.get(), H5F_SCOPE_GLOBAL) >= 0,
        "validation.dump_predictions: cannot flush '",
        path,
        "': ",
        h5::last_error());
    const ssize_t size = H5Fget_file_image(file.get(), nullptr, 0);
    MT_CHECK(
        size > 0,
        "validation.dump_predictions: no file image for '",
        path,
        "': ",
        h5::last_error());
    image.resize(static_cast<size_t>(size));
    MT_CHECK(
        H5Fget_file_image(file.get(), image.data(), image.size()) == size,
        "validation.dump_predictions: cannot copy the file image of '",
        path,
        "': ",
        h5::last_error());
  }
  const auto slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0)
    make_directories(path.substr(0, slash));
  write_file_atomically(path, std::string(image.begin(), image.end()));
}

}  // namespace memtrain
