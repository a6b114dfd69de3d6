#include "h5_util.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "memtrain/util/error.h"
#include "memtrain/util/host_memory.h"

namespace memtrain::h5 {

namespace {
// The descriptions on HDF5's current error stack, outermost (the API call)
// first.
std::vector<std::string> error_descs() {
  std::vector<std::string> descs;
  H5Ewalk2(
      H5E_DEFAULT,
      H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* err, void* data) -> herr_t {
        static_cast<std::vector<std::string>*>(data)->push_back(
            err->desc ? err->desc : "");
        return 0;
      },
      &descs);
  return descs;
}

// HDF5's file drivers record a failed system call as "... errno = 28,
// error message = 'No space left on device', ...": the OS's reason.
std::string system_reason_in(const std::vector<std::string>& descs) {
  static const std::string key = "error message = '";
  for (auto it = descs.rbegin(); it != descs.rend(); ++it) {
    const size_t at = it->find(key);
    if (at == std::string::npos)
      continue;
    const size_t start = at + key.size();
    const size_t end = it->find('\'', start);
    if (end != std::string::npos && end > start)
      return it->substr(start, end - start);
  }
  return "";
}
}  // namespace

std::string last_error() {
  const std::vector<std::string> descs = error_descs();
  if (descs.empty())
    return "";
  // A failed system call says it all ("No space left on device"): the
  // messages above it are HDF5's layers passing it on.
  const std::string os = system_reason_in(descs);
  if (!os.empty())
    return os;
  std::string msg = descs.front();
  if (descs.size() > 1 && !descs.back().empty() &&
      descs.back() != descs.front()) {
    // The innermost message says why ("truncated file: eof = 18886,
    // stored_eof = 43832"); the ones between repeat the outermost.
    msg += ": " + descs.back();
  }
  return msg;
}

std::string system_reason() {
  return system_reason_in(error_descs());
}

namespace {
// Write failures HDF5 reported on this thread, by file ("" where HDF5 named
// none): the first reason for each.
// A failure HDF5 names no file for (no system call failed: a filter, a
// bad argument) counts against the files created before it, not after:
// each failure and each created file have a number in one sequence.
struct Failure {
  uint64_t seq = 0;
  std::string reason;
};
thread_local std::map<std::string, Failure> failed_writes;
thread_local std::map<std::string, uint64_t> created_at;
thread_local uint64_t sequence = 0;

// filename = '...' of a driver's failed system call.
std::string file_in(const std::vector<std::string>& descs) {
  static const std::string key = "filename = '";
  for (const std::string& d : descs) {
    const size_t at = d.find(key);
    if (at == std::string::npos)
      continue;
    const size_t start = at + key.size();
    const size_t end = d.find('\'', start);
    if (end != std::string::npos)
      return d.substr(start, end - start);
  }
  return "";
}

// HDF5 calls this in place of printing, for every failed API call.
herr_t remember_write_failure(hid_t estack, void*) {
  struct Walk {
    std::vector<std::string> descs;
    bool write = false;
  } walk;
  H5Ewalk2(
      estack,
      H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* err, void* data) -> herr_t {
        auto* w = static_cast<Walk*>(data);
        w->descs.push_back(err->desc ? err->desc : "");
        if (err->min_num == H5E_WRITEERROR || err->min_num == H5E_CANTFLUSH)
          w->write = true;
        return 0;
      },
      &walk);
  if (!walk.write)
    return 0;
  std::string reason = system_reason_in(walk.descs);
  if (reason.empty() && !walk.descs.empty())
    reason = walk.descs.back();
  const std::string file = file_in(walk.descs);
  if (file.empty())
    failed_writes[""] = {++sequence, reason};  // the latest: see write_failure
  else
    failed_writes.emplace(file, Failure{++sequence, reason});
  return 0;
}

std::string folder_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Free bytes for an unprivileged writer on the file system of `path`'s
// folder; false if unknown.
bool free_bytes(const std::string& path, uint64_t* out) {
  struct statvfs st {};
  if (::statvfs(folder_of(path).c_str(), &st) != 0)
    return false;
  *out = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  return true;
}
}  // namespace

// Note [No HDF5 shutdown at exit]: HDF5 1.10 keeps the id of a file whose
// H5Fclose failed (its last flush hit a full disk) over a file object it
// has already half taken apart; its own shutdown, installed with atexit(),
// then closes that file again and dies with SIGSEGV in H5F__close_cb
// after memtrain printed its error. memtrain closes every file it writes
// itself, checking the result (finish_file), and a file it only reads
// needs no close at exit, so the shutdown is never installed. It must be
// said before any other HDF5 call: here, at static initialization.
const bool kNoShutdownAtExit = [] {
  H5dont_atexit();
  return true;
}();

void silence_errors() {
  (void)kNoShutdownAtExit;
  // Thread-safe HDF5 keeps an error stack, and its printing, per thread.
  thread_local bool done = false;
  if (!done)
    H5Eset_auto2(H5E_DEFAULT, remember_write_failure, nullptr);
  done = true;
}

herr_t close_file_and_objects(hid_t id) {
  herr_t rc = 0;
  const ssize_t n = H5Fget_obj_count(
      id,
      H5F_OBJ_DATASET | H5F_OBJ_GROUP | H5F_OBJ_DATATYPE | H5F_OBJ_ATTR |
          H5F_OBJ_LOCAL);
  if (n > 0) {
    std::vector<hid_t> ids(static_cast<size_t>(n));
    const ssize_t got = H5Fget_obj_ids(
        id,
        H5F_OBJ_DATASET | H5F_OBJ_GROUP | H5F_OBJ_DATATYPE | H5F_OBJ_ATTR |
            H5F_OBJ_LOCAL,
        ids.size(),
        ids.data());
    for (ssize_t i = 0; i < got; ++i) {
      // The id goes away even when the close fails (HDF5 1.10: a dataset
      // whose chunks cannot be written is still closed).
      const herr_t r =
          H5Iget_type(ids[i]) == H5I_ATTR ? H5Aclose(ids[i]) : H5Oclose(ids[i]);
      if (r < 0)
        rc = r;
    }
  }
  const herr_t r = H5Fclose(id);
  return r < 0 ? r : rc;
}

std::string open_failure(
    const std::string& path, hid_t fapl, bool suggest_verify) {
  silence_errors();
  if (H5Fis_hdf5(path.c_str()) <= 0)
    return "not an HDF5 file (memtrain reads the HDF5 layout of "
           "data/FORMAT.md; `memtrain inspect FILE` checks a file)";
  const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
  if (id >= 0) {
    close_file_and_objects(id);
    return "";
  }
  const std::string why = "cannot open: " + last_error();
  if (!suggest_verify)
    return why;
  return why +
         " (damaged or truncated? check it with `memtrain inspect "
         "--verify " +
         path + "`)";
}

Handle open_file(
    const std::string& path, const std::string& where, hid_t fapl) {
  silence_errors();
  if (H5Fis_hdf5(path.c_str()) > 0) {
    Handle f = file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl));
    if (f.valid())
      return f;
  }
  throw Error(where + ": " + open_failure(path, fapl));
}

Handle create_file(const std::string& path, const std::string& command) {
  silence_errors();
  failed_writes.erase(path);
  created_at[path] = ++sequence;
  Handle f =
      file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  if (!f.valid()) {
    const std::string os = system_reason();
    throw Error(
        command + ": cannot create '" + path + "': " +
        (os.empty() ? last_error() + " (does the folder exist and is it "
                                     "writable?)"
                    : os));
  }
  return f;
}

std::string write_failure(const std::string& path) {
  auto it = failed_writes.find(path);
  if (it != failed_writes.end())
    return it->second.reason;
  it = failed_writes.find("");
  const auto made = created_at.find(path);
  if (it == failed_writes.end() || made == created_at.end() ||
      it->second.seq < made->second)
    return "";
  return it->second.reason;
}

std::string write_reason(hid_t obj) {
  const std::string why = last_error();
  if (system_reason().empty())
    return why;
  return why + free_space_note(file_name(obj));
}

std::string free_space_note(const std::string& path) {
  uint64_t free = 0;
  if (!free_bytes(path, &free))
    return "";
  return " (" + std::to_string(free) + " bytes free on its file system)";
}

void finish_file(Handle* f, const std::string& command) {
  if (!f->valid())
    return;
  const std::string path = file_name(f->get());
  const hid_t id = f->release();
  std::string why;
  if (close_file_and_objects(id) < 0)
    why = last_error();
  const std::string earlier = write_failure(path);
  failed_writes.erase(path);
  created_at.erase(path);
  if (why.empty() && earlier.empty())
    return;
  // The first failure is the cause; the close's repeats it.
  throw Error(
      command + ": cannot write '" + path +
      "': " + (earlier.empty() ? why : earlier) + free_space_note(path));
}

std::string bytes_text(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) {
    bytes /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
  return buf;
}

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
      bytes_text(d.bytes),
      ") uncompressed, but the whole file holds only ",
      file_size,
      " bytes (",
      stored,
      " stored for this dataset): it was never written, or the file is "
      "truncated; re-create it (`memtrain inspect --verify ",
      file_name(ds),
      "` checks a file)"));
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
      bytes_text(need),
      ") of memory, more than this machine's ",
      bytes_text(have)));
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
  bool ok = H5Dset_extent(ds, dims.data()) >= 0;
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
  }
  if (ok)
    return;
  const std::string why = write_reason(ds);
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
