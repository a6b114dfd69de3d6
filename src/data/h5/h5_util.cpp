#include "data/h5/h5_util.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "memtrain/util/error.h"
#include "memtrain/util/host_memory.h"

namespace memtrain::h5 {

namespace {
// The dataset's declared size in bytes (a double: 2^36 x 16 x 4 does not
// overflow it), "SHAPE TYPE", and whether a filter other than Fletcher32
// and shuffle (compression) is in its pipeline.
struct Declared {
  double bytes = 0;
  std::string text;
  bool compressed = false;
  H5D_layout_t layout = H5D_CONTIGUOUS;
};

Declared declared_of(hid_t ds) {
  Declared d;
  const std::vector<hsize_t> dims = dims_of(ds);
  Handle t = type(H5Dget_type(ds));
  d.bytes = static_cast<double>(H5Tget_size(t.get()));
  for (hsize_t n : dims)
    d.bytes *= static_cast<double>(n);
  d.text = shape_text(dims) + " " + type_name(ds);
  Handle dcpl = plist(H5Dget_create_plist(ds));
  d.layout = H5Pget_layout(dcpl.get());
  const int nf = H5Pget_nfilters(dcpl.get());
  for (int i = 0; i < nf; ++i) {
    unsigned flags = 0;
    size_t nelmts = 0;
    const H5Z_filter_t id = H5Pget_filter2(
        dcpl.get(), i, &flags, &nelmts, nullptr, 0, nullptr, nullptr);
    if (id != H5Z_FILTER_FLETCHER32 && id != H5Z_FILTER_SHUFFLE)
      d.compressed = true;
  }
  return d;
}
}  // namespace

void check_declared_size(hid_t ds, const std::string& where) {
  const Declared d = declared_of(ds);
  if (d.compressed || d.layout == H5D_COMPACT)
    return;
  hsize_t file_size = 0;
  {
    Handle f(H5Iget_file_id(ds), H5Fclose);  // a reference, not a close
    if (!f.valid() || H5Fget_filesize(f.get(), &file_size) < 0)
      return;
  }
  // Uncompressed bytes are stored as they are: a file smaller than one of
  // its datasets does not hold it (the header and the other datasets take
  // their share too, so this only catches what cannot be).
  if (d.bytes <= static_cast<double>(file_size))
    return;
  // ... except the chunks never written, which read as zeros: a volume
  // file of cases of different shapes stores only the chunks inside each
  // case (convert-dataset), a few percent of the box at worst. A chunked
  // dataset is refused when it stores next to nothing of a large size.
  const hsize_t stored = H5Dget_storage_size(ds);
  if (d.layout == H5D_CHUNKED &&
      (d.bytes < static_cast<double>(1u << 30) ||
       d.bytes < 4096.0 * static_cast<double>(stored)))
    return;
  throw Error(detail::concat(
      where,
      ": declares ",
      d.text,
      ", ",
      static_cast<uint64_t>(std::min(d.bytes, 1.8e19)),
      " bytes (",
      format_bytes(d.bytes),
      ") uncompressed, but the whole file holds only ",
      file_size,
      " bytes (",
      stored,
      " stored for this dataset): it was never written, or the file is "
      "truncated; re-create it (`memtrain inspect --verify ",
      file_name(ds),
      "` checks a file)"));
}

int64_t chunk_cache_bound(hid_t ds) {
  const Declared d = declared_of(ds);
  if (d.layout != H5D_CHUNKED)
    return 0;
  Handle dapl = plist(H5Dget_access_plist(ds));
  size_t slots = 0, bytes = 0;
  double w0 = 0;
  if (H5Pget_chunk_cache(dapl.get(), &slots, &bytes, &w0) < 0)
    return 0;
  return static_cast<int64_t>(std::min(static_cast<double>(bytes), d.bytes));
}

void check_fits_memory(hid_t ds, const std::string& where) {
  const Declared d = declared_of(ds);
  const uint64_t total = total_host_memory();
  if (total == 0)
    return;
  // Read as 8-byte integers whatever the stored type.
  const std::vector<hsize_t> dims = dims_of(ds);
  double elems = 1;
  for (hsize_t n : dims)
    elems *= static_cast<double>(n);
  const double need = std::max(d.bytes, elems * 8);
  const double have = static_cast<double>(total);
  if (need <= have)
    return;
  throw Error(detail::concat(
      where,
      ": ",
      d.text,
      " is read whole and would need ",
      static_cast<uint64_t>(std::min(need, 1.8e19)),
      " bytes (",
      format_bytes(need),
      ") of memory, more than this machine's ",
      format_bytes(have)));
}

bool has_link(hid_t loc, const std::string& name) {
  return H5Lexists(loc, name.c_str(), H5P_DEFAULT) > 0;
}

std::string file_name(hid_t obj) {
  char path[4096] = {0};
  H5Fget_name(obj, path, sizeof(path));
  return path;
}

std::string object_name(hid_t obj) {
  char name[1024] = {0};
  H5Iget_name(obj, name, sizeof(name));
  return name;
}

std::vector<hsize_t> dims_of(hid_t dataset) {
  Handle sp = space(H5Dget_space(dataset));
  const int rank = H5Sget_simple_extent_ndims(sp.get());
  std::vector<hsize_t> dims(rank > 0 ? rank : 0);
  if (rank > 0)
    H5Sget_simple_extent_dims(sp.get(), dims.data(), nullptr);
  return dims;
}

std::string type_name(hid_t dataset) {
  Handle t = type(H5Dget_type(dataset));
  const size_t size = H5Tget_size(t.get());
  switch (H5Tget_class(t.get())) {
    case H5T_INTEGER: {
      const bool sign = H5Tget_sign(t.get()) == H5T_SGN_2;
      return std::string(sign ? "int" : "uint") + std::to_string(size * 8);
    }
    case H5T_FLOAT:
      return "float" + std::to_string(size * 8);
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    default:
      return "other";
  }
}

bool is_integer(hid_t dataset) {
  Handle t = type(H5Dget_type(dataset));
  return H5Tget_class(t.get()) == H5T_INTEGER;
}

bool is_float(hid_t dataset) {
  Handle t = type(H5Dget_type(dataset));
  return H5Tget_class(t.get()) == H5T_FLOAT;
}

bool has_fletcher32(hid_t dataset) {
  Handle dcpl = plist(H5Dget_create_plist(dataset));
  return H5Pget_layout(dcpl.get()) == H5D_CHUNKED &&
         H5Pall_filters_avail(dcpl.get()) >= 0 &&
         H5Pget_filter_by_id2(
             dcpl.get(),
             H5Z_FILTER_FLETCHER32,
             nullptr,
             nullptr,
             nullptr,
             0,
             nullptr,
             nullptr) >= 0;
}

std::vector<hsize_t> row_chunk(
    const std::vector<hsize_t>& dims, size_t elem_size) {
  std::vector<hsize_t> chunk(dims);
  if (chunk.empty())
    return chunk;
  hsize_t row_bytes = elem_size;
  for (size_t d = 1; d < dims.size(); ++d)
    row_bytes *= std::max<hsize_t>(1, dims[d]);
  const hsize_t rows = std::max<hsize_t>(1, (hsize_t{1} << 20) / row_bytes);
  chunk[0] = std::max<hsize_t>(1, std::min(rows, dims[0]));
  for (size_t d = 1; d < dims.size(); ++d)
    chunk[d] = std::max<hsize_t>(1, dims[d]);
  return chunk;
}

namespace {
Handle open_attr(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0)
    return Handle();
  return attribute(H5Aopen(obj, name, H5P_DEFAULT));
}
}  // namespace

bool read_attr(hid_t obj, const char* name, int64_t* out) {
  Handle a = open_attr(obj, name);
  if (!a.valid())
    return false;
  Handle t = type(H5Aget_type(a.get()));
  MT_CHECK(
      H5Tget_class(t.get()) == H5T_INTEGER,
      "attribute '",
      name,
      "' must be an integer");
  MT_CHECK(
      H5Aread(a.get(), H5T_NATIVE_INT64, out) >= 0,
      "cannot read attribute '",
      name,
      "': ",
      last_error());
  return true;
}

bool read_attr(hid_t obj, const char* name, double* out) {
  Handle a = open_attr(obj, name);
  if (!a.valid())
    return false;
  Handle t = type(H5Aget_type(a.get()));
  const auto cls = H5Tget_class(t.get());
  MT_CHECK(
      cls == H5T_FLOAT || cls == H5T_INTEGER,
      "attribute '",
      name,
      "' must be a number");
  MT_CHECK(
      H5Aread(a.get(), H5T_NATIVE_DOUBLE, out) >= 0,
      "cannot read attribute '",
      name,
      "': ",
      last_error());
  return true;
}

bool read_attr(hid_t obj, const char* name, std::string* out) {
  Handle a = open_attr(obj, name);
  if (!a.valid())
    return false;
  Handle t = type(H5Aget_type(a.get()));
  MT_CHECK(
      H5Tget_class(t.get()) == H5T_STRING,
      "attribute '",
      name,
      "' must be a string");
  if (H5Tis_variable_str(t.get()) > 0) {
    Handle mem = type(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem.get(), H5T_VARIABLE);
    char* value = nullptr;
    MT_CHECK(
        H5Aread(a.get(), mem.get(), &value) >= 0,
        "cannot read attribute '",
        name,
        "': ",
        last_error());
    *out = value ? value : "";
    H5free_memory(value);
  } else {
    const size_t size = H5Tget_size(t.get());
    std::string buf(size, '\0');
    MT_CHECK(
        H5Aread(a.get(), t.get(), buf.data()) >= 0,
        "cannot read attribute '",
        name,
        "': ",
        last_error());
    *out = buf.substr(0, buf.find('\0'));
  }
  return true;
}

namespace {
void write_raw(
    hid_t obj,
    const char* name,
    hid_t file_type,
    hid_t mem_type,
    const void* data) {
  if (H5Aexists(obj, name) > 0)
    H5Adelete(obj, name);
  Handle sp = space(H5Screate(H5S_SCALAR));
  Handle a = attribute(
      H5Acreate2(obj, name, file_type, sp.get(), H5P_DEFAULT, H5P_DEFAULT));
  MT_CHECK(
      a.valid() && H5Awrite(a.get(), mem_type, data) >= 0,
      "cannot write attribute '",
      name,
      "': ",
      last_error());
}
}  // namespace

void write_attr(hid_t obj, const char* name, int64_t value) {
  write_raw(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void write_attr(hid_t obj, const char* name, double value) {
  write_raw(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

void write_attr(hid_t obj, const char* name, const std::string& value) {
  Handle t = type(H5Tcopy(H5T_C_S1));
  H5Tset_size(t.get(), value.size() + 1);
  H5Tset_strpad(t.get(), H5T_STR_NULLTERM);
  write_raw(obj, name, t.get(), t.get(), value.c_str());
}

Handle create_dataset(
    hid_t file,
    const char* name,
    hid_t file_type,
    const std::vector<hsize_t>& dims,
    const std::vector<hsize_t>& chunk,
    bool extendible) {
  std::vector<hsize_t> max_dims = dims;
  if (extendible && !max_dims.empty())
    max_dims[0] = H5S_UNLIMITED;
  Handle sp = space(H5Screate_simple(
      static_cast<int>(dims.size()), dims.data(), max_dims.data()));
  Handle dcpl = plist(H5Pcreate(H5P_DATASET_CREATE));
  const std::vector<hsize_t> shape =
      chunk.empty() ? row_chunk(dims, H5Tget_size(file_type)) : chunk;
  // Fletcher32 is the whole pipeline (no compression): every chunk's bytes
  // carry a checksum that every read of the chunk checks.
  if (H5Pset_chunk(dcpl.get(), static_cast<int>(shape.size()), shape.data()) <
          0 ||
      H5Pset_fletcher32(dcpl.get()) < 0) {
    throw Error(detail::concat(
        "cannot set chunks and checksums of dataset '",
        name,
        "' in '",
        file_name(file),
        "': ",
        last_error()));
  }
  Handle ds = dataset(H5Dcreate2(
      file, name, file_type, sp.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
  if (!ds.valid()) {
    const std::string why = write_reason(file);
    throw Error(detail::concat(
        "cannot create dataset '",
        name,
        "' in '",
        file_name(file),
        "': ",
        why));
  }
  return ds;
}

void write_dataset(
    hid_t file,
    const char* name,
    hid_t file_type,
    hid_t mem_type,
    const std::vector<hsize_t>& dims,
    const std::vector<hsize_t>& chunk,
    const void* data) {
  Handle ds = create_dataset(file, name, file_type, dims, chunk, false);
  // The close writes the chunks still in HDF5's cache: its failure is the
  // write's.
  if (H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0 &&
      H5Dclose(ds.release()) >= 0)
    return;
  const std::string why = write_reason(file);
  throw Error(detail::concat(
      "cannot write dataset '", name, "' to '", file_name(file), "': ", why));
}

void append_rows(hid_t ds, hid_t mem_type, hsize_t rows, const void* data) {
  if (rows == 0)
    return;
  std::vector<hsize_t> dims = dims_of(ds);
  const hsize_t start = dims[0];
  dims[0] += rows;
  // The reason is taken before the spaces below close: a close, as any
  // HDF5 call, clears the error stack (the message said nothing after
  // "in 'FILE': " when rows past the chunk cache hit a full disk).
  std::string why;
  bool ok = H5Dset_extent(ds, dims.data()) >= 0;
  if (!ok)
    why = write_reason(ds);
  if (ok) {
    Handle file_space = space(H5Dget_space(ds));
    std::vector<hsize_t> offset(dims.size(), 0), count = dims;
    offset[0] = start;
    count[0] = rows;
    Handle mem_space = space(H5Screate_simple(
        static_cast<int>(count.size()), count.data(), nullptr));
    ok = file_space.valid() && mem_space.valid() &&
         H5Sselect_hyperslab(
             file_space.get(),
             H5S_SELECT_SET,
             offset.data(),
             nullptr,
             count.data(),
             nullptr) >= 0 &&
         H5Dwrite(
             ds,
             mem_type,
             mem_space.get(),
             file_space.get(),
             H5P_DEFAULT,
             data) >= 0;
    if (!ok)
      why = write_reason(ds);
  }
  if (ok)
    return;
  throw Error(detail::concat(
      "cannot append ",
      rows,
      " rows to dataset '",
      object_name(ds),
      "' in '",
      file_name(ds),
      "': ",
      why));
}

std::string path_stem(const std::string& out) {
  for (const std::string ext : {".h5", ".hdf5"}) {
    if (out.size() > ext.size() &&
        out.compare(out.size() - ext.size(), ext.size(), ext) == 0)
      return out.substr(0, out.size() - ext.size());
  }
  return out;
}

std::string shape_text(const std::vector<hsize_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i)
    s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

std::vector<std::string> split_names(const std::string& joined) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= joined.size() && !joined.empty()) {
    const size_t end = joined.find(',', start);
    out.push_back(joined.substr(start, end - start));
    if (end == std::string::npos)
      break;
    start = end + 1;
  }
  return out;
}

std::vector<std::string> read_strings(hid_t ds) {
  const std::string where =
      "'" + file_name(ds) + "' dataset '" + object_name(ds) + "'";
  Handle t = type(H5Dget_type(ds));
  const auto dims = dims_of(ds);
  MT_CHECK(
      H5Tget_class(t.get()) == H5T_STRING && dims.size() == 1,
      where,
      ": expected a 1-D dataset of strings, found ",
      type_name(ds),
      " of ",
      dims.size(),
      " dimensions");
  check_declared_size(ds, where);
  check_fits_memory(ds, where);
  const size_t n = static_cast<size_t>(dims[0]);
  std::vector<std::string> out(n);
  if (n == 0)
    return out;
  if (H5Tis_variable_str(t.get()) > 0) {
    Handle mem = type(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem.get(), H5T_VARIABLE);
    std::vector<char*> ptrs(n, nullptr);
    MT_CHECK(
        H5Dread(ds, mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()) >= 0,
        "cannot read ",
        where,
        ": ",
        last_error());
    for (size_t i = 0; i < n; ++i) {
      out[i] = ptrs[i] ? ptrs[i] : "";
      H5free_memory(ptrs[i]);
    }
    return out;
  }
  const size_t size = H5Tget_size(t.get());
  std::vector<char> buf(n * size);
  MT_CHECK(
      H5Dread(ds, t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) >= 0,
      "cannot read ",
      where,
      ": ",
      last_error());
  for (size_t i = 0; i < n; ++i) {
    const char* p = buf.data() + i * size;
    out[i].assign(p, strnlen(p, size));
  }
  return out;
}

}  // namespace memtrain::h5
