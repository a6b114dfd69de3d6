#pragma once
// Private HDF5 helpers: RAII handles and error text from HDF5's error stack.
// Kept out of include/ so that no public header includes hdf5.h.

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace memtrain::h5 {

// Turns off HDF5's automatic error printing (once per thread: the setting
// is per thread); memtrain reports HDF5 failures itself, with the file and
// dataset named. In its place, every failed write that HDF5 reports on this
// thread is remembered with its file (see finish_file): a write can fail
// where no caller sees it, as when a Handle closes a dataset whose cached
// chunks HDF5 cannot write out.
void silence_errors();

// HDF5's reason for the failure on its current error stack ("" if none):
// the OS's reason where a system call failed ("No space left on device"),
// else the failed call's message and the innermost one ("unable to open
// file: truncated file: eof = 18886, stored_eof = 43832").
std::string last_error();
// Only the OS's reason on HDF5's current error stack ("No space left on
// device"; "" if no system call failed).
std::string system_reason();

// Owns one hid_t and closes it with the matching H5*close.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer close) : id_(id), close_(close) {}
  ~Handle() {
    reset();
  }
  Handle(Handle&& o) noexcept
      : id_(std::exchange(o.id_, H5I_INVALID_HID)), close_(o.close_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      close_ = o.close_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t get() const {
    return id_;
  }
  bool valid() const {
    return id_ >= 0;
  }
  // Gives up the id without closing it.
  hid_t release() {
    return std::exchange(id_, H5I_INVALID_HID);
  }
  void reset() {
    if (id_ >= 0 && close_)
      close_(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer close_ = nullptr;
};

// Closes every object of file `id` that is still open (a dataset, group,
// datatype or attribute keeps its file open past H5Fclose), then the file;
// < 0 if any of these failed. After it HDF5 holds nothing of the file, so
// that its shutdown at exit() never closes it again.
herr_t close_file_and_objects(hid_t id);

inline Handle file(hid_t id) {
  return Handle(id, close_file_and_objects);
}
inline Handle dataset(hid_t id) {
  return Handle(id, H5Dclose);
}
inline Handle space(hid_t id) {
  return Handle(id, H5Sclose);
}
inline Handle type(hid_t id) {
  return Handle(id, H5Tclose);
}
inline Handle plist(hid_t id) {
  return Handle(id, H5Pclose);
}
inline Handle attribute(hid_t id) {
  return Handle(id, H5Aclose);
}

// Opens `path` read-only for `where` ("data.train: 'x.h5'"). Throws
// memtrain::Error "WHERE: not an HDF5 file (...)" or "WHERE: cannot open:
// HDF5'S REASON; check it with `memtrain inspect --verify PATH`": the one
// place these refusals are worded. `fapl` may be H5P_DEFAULT.
Handle open_file(const std::string& path, const std::string& where, hid_t fapl);
// The text after "WHERE: " of open_file's refusal ("" if HDF5 opens it);
// without `suggest_verify`, the reason alone (for inspect --verify).
std::string open_failure(
    const std::string& path, hid_t fapl, bool suggest_verify = true);

// Creates (truncates) `path`, the temporary file of a writer: throws
// memtrain::Error "COMMAND: cannot create 'PATH': REASON".
Handle create_file(const std::string& path, const std::string& command);
// Closes the file `file` was writing (every object of it still open, then
// the file) and throws memtrain::Error "COMMAND: cannot write 'PATH':
// REASON (N bytes free on its file system)" if any write to it failed
// since create_file, here or before (REASON: the OS's, "No space left on
// device", where a system call failed). Call it before the
// file is published; on an error path the Handle's own close is enough.
void finish_file(Handle* file, const std::string& command);
// A write failure HDF5 reported for `path` since create_file ("" if
// none): the OS's reason where there is one.
std::string write_failure(const std::string& path);
// " (N bytes free on its file system)" for the folder of `path`, "" if
// unknown.
std::string free_space_note(const std::string& path);
// last_error() for a failed write to the file of `obj`, with
// free_space_note where a system call failed. Call it first: every other
// HDF5 call clears the error stack (a cleared stack gives the failure HDF5
// reported for the file, write_failure, or says there was no reason).
std::string write_reason(hid_t obj);

// Refuses, before anything is allocated from it, a dataset whose declared
// size cannot be real: uncompressed data of more bytes than the whole file
// holds (never written, or the file is truncated). Throws memtrain::Error
// "WHERE: declares SHAPE TYPE, B bytes (X GiB), but the file holds only F
// bytes (S stored for this dataset): ...". `where` names file and dataset.
void check_declared_size(hid_t dataset, const std::string& where);
// The most the chunk cache of `dataset` holds in memory: the cache size of
// its access list (H5Pset_chunk_cache), or its whole size when smaller; 0
// when it is not chunked (HDF5 keeps no chunk cache then).
int64_t chunk_cache_bound(hid_t dataset);
// Refuses a dataset that is read whole into memory (labels, ids, shapes)
// when it is larger than this machine's memory: "WHERE: SHAPE TYPE would
// need B bytes in memory, more than this machine's M".
void check_fits_memory(hid_t dataset, const std::string& where);

bool has_link(hid_t loc, const std::string& name);
// The path of the file that holds `obj`, and `obj`'s own path in it.
std::string file_name(hid_t obj);
std::string object_name(hid_t obj);
std::vector<hsize_t> dims_of(hid_t dataset);
// "float32", "uint8", "int64", "string", ...
std::string type_name(hid_t dataset);
bool is_integer(hid_t dataset);
bool is_float(hid_t dataset);
// Whether the dataset's filter pipeline has the Fletcher32 checksum.
bool has_fletcher32(hid_t dataset);
// The chunk shape used for `dims` when write_dataset is given none: whole
// rows, as many as fit in about 1 MiB (at least one), of `elem_size` bytes.
std::vector<hsize_t> row_chunk(
    const std::vector<hsize_t>& dims, size_t elem_size);

// Attributes on an object (file root or dataset). Readers return false when
// the attribute is missing; they throw memtrain::Error on a wrong type.
bool read_attr(hid_t obj, const char* name, int64_t* out);
bool read_attr(hid_t obj, const char* name, double* out);
bool read_attr(hid_t obj, const char* name, std::string* out);
// Creates dataset `name` in `file` with `dims`, chunked as `chunk` (empty:
// whole rows, about 1 MiB a chunk) with HDF5's Fletcher32 checksum on every
// chunk (Note [Checksummed data] in ARCHITECTURE.md), and writes `data` (of
// `mem_type`). Throws memtrain::Error naming the dataset and the file.
void write_dataset(
    hid_t file,
    const char* name,
    hid_t file_type,
    hid_t mem_type,
    const std::vector<hsize_t>& dims,
    const std::vector<hsize_t>& chunk,
    const void* data);
// The same dataset, created empty-handed: `dims` (the first may be 0 when
// `extendible`: the first dimension then has no maximum, for append_rows).
Handle create_dataset(
    hid_t file,
    const char* name,
    hid_t file_type,
    const std::vector<hsize_t>& dims,
    const std::vector<hsize_t>& chunk,
    bool extendible);
// Grows an extendible dataset by `rows` along its first dimension and
// writes them (`data`: rows x the other dimensions, of `mem_type`).
void append_rows(hid_t dataset, hid_t mem_type, hsize_t rows, const void* data);
// "[4,1,32,32,32]".
std::string shape_text(const std::vector<hsize_t>& dims);
// An output path without its HDF5 ending: "out/x.h5" -> "out/x" (also
// .hdf5; any other name as it is). The converters name the files they write
// beside it from it (x-val.h5, x-train.h5).
std::string path_stem(const std::string& out);
// "a,b,c" -> {"a", "b", "c"}; "" -> {}.
std::vector<std::string> split_names(const std::string& joined);
// A 1-D dataset of strings (fixed-length or variable-length), one per row;
// throws memtrain::Error naming the dataset for another type.
std::vector<std::string> read_strings(hid_t dataset);
void write_attr(hid_t obj, const char* name, int64_t value);
void write_attr(hid_t obj, const char* name, double value);
void write_attr(hid_t obj, const char* name, const std::string& value);

}  // namespace memtrain::h5
