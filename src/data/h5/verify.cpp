// `memtrain inspect --verify`: every chunk of every dataset read through
// HDF5's filter pipeline, so that each Fletcher32 checksum is checked.

#include <algorithm>
#include <string>
#include <vector>

#include "data/h5/h5_read.h"
#include "data/h5/h5_util.h"
#include "data/h5/layout.h"
#include "memtrain/data/h5/inspect.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

// Every dataset in the file, at any depth ("features", "group/x").
std::vector<std::string> dataset_names(hid_t file) {
  std::vector<std::string> names;
  H5Lvisit(
      file,
      H5_INDEX_NAME,
      H5_ITER_INC,
      [](hid_t loc, const char* name, const H5L_info_t*, void* data) {
        const hid_t obj = H5Oopen(loc, name, H5P_DEFAULT);
        if (obj >= 0) {
          if (H5Iget_type(obj) == H5I_DATASET)
            static_cast<std::vector<std::string>*>(data)->push_back(name);
          H5Oclose(obj);
        }
        return herr_t{0};
      },
      &names);
  return names;
}

// What a chunk at `offset` of `count` elements covers: "rows 0-255" (whole
// rows; "volumes 2-3" for /volumes and /masks), "volume 2, voxels [0-15,
// 16-31, 0-15]" (a box of a volume dataset), else the box itself.
std::string covers(
    const std::string& name,
    const std::vector<hsize_t>& dims,
    const std::vector<hsize_t>& offset,
    const std::vector<hsize_t>& count) {
  bool whole_rows = true;
  for (size_t d = 1; d < dims.size(); ++d)
    whole_rows = whole_rows && offset[d] == 0 && count[d] == dims[d];
  const bool volume = name == layout::kVolumes || name == layout::kMasks;
  if (whole_rows && !dims.empty()) {
    std::vector<int64_t> rows;
    for (hsize_t r = offset[0]; r < offset[0] + count[0]; ++r)
      rows.push_back(static_cast<int64_t>(r));
    return h5::rows_text(rows, volume ? "volumes" : "rows");
  }
  const size_t first = volume && dims.size() >= 4 ? dims.size() - 3 : 0;
  std::string s = volume ? detail::concat("volume ", offset[0], ", voxels [")
                         : std::string("elements [");
  for (size_t d = first; d < dims.size(); ++d) {
    s += detail::concat(
        d > first ? ", " : "", offset[d], "-", offset[d] + count[d] - 1);
  }
  return s + "]";
}

// Reads every chunk of `ds` (which has checksums); damaged ones go to
// `report`.
void verify_dataset(hid_t ds, const std::string& name, VerifyReport& report) {
  const auto dims = h5::dims_of(ds);
  const int rank = static_cast<int>(dims.size());
  h5::Handle ftype = h5::type(H5Dget_type(ds));
  h5::Handle mtype = h5::type(H5Tget_native_type(ftype.get(), H5T_DIR_ASCEND));
  const size_t elem = H5Tget_size(mtype.get());
  h5::Handle dcpl = h5::plist(H5Dget_create_plist(ds));
  std::vector<hsize_t> chunk(rank);
  H5Pget_chunk(dcpl.get(), rank, chunk.data());
  h5::Handle fspace = h5::space(H5Dget_space(ds));
  hsize_t n = 0;
  H5Dget_num_chunks(ds, fspace.get(), &n);
  std::vector<char> buf;
  for (hsize_t i = 0; i < n; ++i) {
    std::vector<hsize_t> offset(rank, 0), count(rank, 0);
    unsigned filter_mask = 0;
    haddr_t addr = 0;
    hsize_t size = 0;
    H5Dget_chunk_info(
        ds, fspace.get(), i, offset.data(), &filter_mask, &addr, &size);
    size_t numel = 1;
    for (int d = 0; d < rank; ++d) {
      count[d] = std::min(chunk[d], dims[d] - offset[d]);
      numel *= count[d];
    }
    buf.resize(numel * elem);
    h5::Handle sel = h5::space(H5Dget_space(ds));
    H5Sselect_hyperslab(
        sel.get(),
        H5S_SELECT_SET,
        offset.data(),
        nullptr,
        count.data(),
        nullptr);
    h5::Handle mem = h5::space(H5Screate_simple(rank, count.data(), nullptr));
    ++report.chunks;
    if (H5Dread(
            ds, mtype.get(), mem.get(), sel.get(), H5P_DEFAULT, buf.data()) >=
        0)
      continue;
    std::string at = "[";
    for (int d = 0; d < rank; ++d)
      at += detail::concat(d ? ", " : "", offset[d]);
    report.damaged.push_back(detail::concat(
        "'/",
        name,
        "' chunk ",
        i,
        " of ",
        n,
        " at ",
        at,
        "] (",
        covers(name, dims, offset, count),
        "; ",
        size,
        " bytes at file offset ",
        addr,
        "): ",
        h5::checksum_failed() ? "checksum mismatch" : h5::last_error()));
  }
}

}  // namespace

int VerifyReport::exit_status() const {
  if (!opened || !damaged.empty())
    return 2;
  return unchecksummed.empty() ? 0 : 1;
}

VerifyReport verify_file(const std::string& path) {
  h5::silence_errors();
  VerifyReport report;
  std::string& out = report.text;
  h5::Handle file;
  if (H5Fis_hdf5(path.c_str()) > 0)
    file = h5::file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!file.valid()) {
    out = "'" + path + "': not a readable HDF5 file: " +
          h5::open_failure(path, H5P_DEFAULT, /*suggest_verify=*/false) + "\n";
    return report;
  }
  report.opened = true;
  // No chunk cache: every chunk is read from the file once.
  h5::Handle dapl = h5::plist(H5Pcreate(H5P_DATASET_ACCESS));
  H5Pset_chunk_cache(dapl.get(), H5D_CHUNK_CACHE_NSLOTS_DEFAULT, 0, 1.0);
  for (const std::string& name : dataset_names(file.get())) {
    h5::Handle ds = h5::dataset(H5Dopen2(file.get(), name.c_str(), dapl.get()));
    if (!ds.valid() || !h5::has_fletcher32(ds.get())) {
      report.unchecksummed.push_back("/" + name);
      continue;
    }
    ++report.datasets;
    verify_dataset(ds.get(), name, report);
  }
  for (const std::string& d : report.damaged)
    out += "damaged: " + d + "\n";
  std::string names;
  for (const std::string& u : report.unchecksummed)
    names += (names.empty() ? "" : ", ") + u;
  if (!report.unchecksummed.empty()) {
    out += detail::concat(
        "cannot be verified: ",
        names,
        " (no Fletcher32 checksum: written by another tool without one; "
        "rewrite with `memtrain make-data`/`convert-nifti`, or `h5repack -f "
        "FLET IN OUT`, to add them)\n");
  }
  if (!report.damaged.empty()) {
    out += detail::concat(
        "'",
        path,
        "': ",
        report.damaged.size(),
        " of ",
        report.chunks,
        " chunks damaged: the file is damaged; re-create it or restore it "
        "from a copy\n");
  } else if (report.datasets > 0 || report.unchecksummed.empty()) {
    out += detail::concat(
        report.unchecksummed.empty() ? "all " : "",
        report.chunks,
        " chunks of ",
        report.datasets,
        " datasets verified\n");
  }
  return report;
}

}  // namespace memtrain
