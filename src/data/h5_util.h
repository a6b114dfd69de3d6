#pragma once
// Private HDF5 helpers: RAII handles and error text from HDF5's error stack.
// Kept out of include/ so that no public header includes hdf5.h.

#include <hdf5.h>

#include <string>
#include <utility>
#include <vector>

namespace memtrain::h5 {

// Turns off HDF5's automatic error printing (once per thread: the setting
// is per thread); memtrain reports HDF5 failures itself, with the file and
// dataset named.
void silence_errors();

// The innermost message on HDF5's current error stack ("" if none).
std::string last_error();

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
  void reset() {
    if (id_ >= 0 && close_)
      close_(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer close_ = nullptr;
};

inline Handle file(hid_t id) {
  return Handle(id, H5Fclose);
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
// "a,b,c" -> {"a", "b", "c"}; "" -> {}.
std::vector<std::string> split_names(const std::string& joined);
// A 1-D dataset of strings (fixed-length or variable-length), one per row;
// throws memtrain::Error naming the dataset for another type.
std::vector<std::string> read_strings(hid_t dataset);
void write_attr(hid_t obj, const char* name, int64_t value);
void write_attr(hid_t obj, const char* name, double value);
void write_attr(hid_t obj, const char* name, const std::string& value);

}  // namespace memtrain::h5
