#include "data/h5/h5_read.h"

#include "memtrain/util/error.h"

namespace memtrain::h5 {

bool checksum_failed() {
  bool found = false;
  H5Ewalk2(
      H5E_DEFAULT,
      H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* err, void* data) -> herr_t {
        // HDF5's Fletcher32 filter: "data error detected by Fletcher32
        // checksum" (H5E_STORAGE, H5E_READERROR).
        if (err->desc &&
            std::string(err->desc).find("Fletcher32") != std::string::npos)
          *static_cast<bool*>(data) = true;
        return 0;
      },
      &found);
  return found;
}

std::string rows_text(const std::vector<int64_t>& rows, const char* noun) {
  constexpr int kMaxRuns = 8;
  std::string s = noun;
  int runs = 0;
  for (size_t i = 0; i < rows.size();) {
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1)
      ++j;
    if (runs == kMaxRuns) {
      s += ", ... (" + std::to_string(rows.size()) + " in all)";
      break;
    }
    s += (runs ? ", " : " ") + std::to_string(rows[i]);
    if (j - i > 1)
      s += "-" + std::to_string(rows[j - 1]);
    ++runs;
    i = j;
  }
  return s;
}

namespace {

std::string axes_text(const std::vector<hsize_t>& v) {
  std::string s = "[";
  for (size_t i = v.size() - 3; i < v.size(); ++i)
    s += (i > v.size() - 3 ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// H5Dread, or a memtrain::Error naming the file, the dataset and `what`
// (the selection), and saying so when the file is damaged.
void dread(
    hid_t ds,
    hid_t mem_type,
    hid_t mspace,
    hid_t fspace,
    void* buf,
    const std::string& what) {
  silence_errors();  // per thread: reads run on the prefetcher's threads
  if (H5Dread(ds, mem_type, mspace, fspace, H5P_DEFAULT, buf) >= 0)
    return;
  // The error stack first: the next HDF5 call clears it.
  const bool damaged = checksum_failed();
  const std::string why = last_error();
  const std::string file = file_name(ds);
  const std::string where =
      detail::concat("'", file, "' dataset '", object_name(ds), "' ", what);
  if (damaged) {
    throw Error(detail::concat(
        where,
        ": the file is damaged (checksum mismatch: a chunk's bytes are not "
        "the bytes written). Re-create it (memtrain make-data / "
        "convert-nifti) or restore it from a copy; `memtrain inspect "
        "--verify ",
        file,
        "` lists the damaged chunks"));
  }
  throw Error(detail::concat("cannot read ", where, ": ", why));
}

}  // namespace

void read_rows(
    hid_t ds,
    const std::vector<int64_t>& rows,
    hid_t mem_type,
    void* buf,
    const char* noun) {
  const auto dims = dims_of(ds);
  const int rank = static_cast<int>(dims.size());
  Handle fspace = space(H5Dget_space(ds));
  H5Sselect_none(fspace.get());
  hsize_t row_numel = 1;
  for (int d = 1; d < rank; ++d)
    row_numel *= dims[d];
  // Runs of consecutive rows are one block each.
  for (size_t i = 0; i < rows.size();) {
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1)
      ++j;
    std::vector<hsize_t> start(rank, 0), count(rank, 1), block(dims);
    start[0] = static_cast<hsize_t>(rows[i]);
    block[0] = static_cast<hsize_t>(j - i);
    H5Sselect_hyperslab(
        fspace.get(),
        H5S_SELECT_OR,
        start.data(),
        nullptr,
        count.data(),
        block.data());
    i = j;
  }
  // One run of rows (a whole volume, consecutive rows): a memory space of
  // its shape (see read_box); a union of runs: flat.
  std::vector<hsize_t> mdims(dims);
  mdims[0] = rows.size();
  const bool one_run =
      static_cast<size_t>(rows.back() - rows.front() + 1) == rows.size();
  const hsize_t flat = rows.size() * row_numel;
  Handle mspace = space(
      one_run ? H5Screate_simple(rank, mdims.data(), nullptr)
              : H5Screate_simple(1, &flat, nullptr));
  dread(ds, mem_type, mspace.get(), fspace.get(), buf, rows_text(rows, noun));
}

void read_box(
    hid_t ds,
    const std::vector<hsize_t>& start,
    const std::vector<hsize_t>& count,
    hid_t mem_type,
    void* buf) {
  Handle fspace = space(H5Dget_space(ds));
  H5Sselect_hyperslab(
      fspace.get(),
      H5S_SELECT_SET,
      start.data(),
      nullptr,
      count.data(),
      nullptr);
  // A memory space of the box's own shape: HDF5 1.10 then copies whole
  // rows per chunk; a flat 1-D memory space makes it map every voxel to its
  // chunk one by one (see docs/benchmarks.md).
  Handle mspace = space(
      H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr));
  dread(
      ds,
      mem_type,
      mspace.get(),
      fspace.get(),
      buf,
      detail::concat(
          "volume ",
          start[0],
          ", patch at ",
          axes_text(start),
          " of ",
          axes_text(count),
          " voxels"));
}

void read_all(hid_t ds, hid_t mem_type, void* buf) {
  const auto dims = dims_of(ds);
  dread(
      ds,
      mem_type,
      H5S_ALL,
      H5S_ALL,
      buf,
      dims.empty() ? "(all of it)"
                   : detail::concat("rows 0-", dims[0] - 1, " (all of it)"));
}

}  // namespace memtrain::h5
