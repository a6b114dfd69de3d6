#pragma once
// Helpers shared by the unit and MPI tests: temporary folders, synthetic
// files, hand-made broken HDF5 files.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace memtrain {
class Placement;
}

namespace memtrain::test {

// A fresh folder under the system temp dir (or $TMPDIR), removed at exit of
// the object. `name` makes it recognisable.
class TempDir {
 public:
  explicit TempDir(const std::string& name);
  ~TempDir();
  const std::string& path() const {
    return path_;
  }
  std::string file(const std::string& name) const {
    return path_ + "/" + name;
  }

 private:
  std::string path_;
};

// Writes an HDF5 file with the given datasets (any may be left empty to
// omit it). Shapes are the full dataset shapes. Used to build broken files.
struct RawH5 {
  std::vector<uint64_t> features_shape;  // float32 /features
  std::vector<uint64_t> images_shape;    // float32 /images
  std::vector<uint64_t> labels_shape;    // int64 /labels
  bool labels_as_float = false;          // /labels stored as float32
  bool features_as_int = false;          // /features stored as int32
  std::vector<int64_t> label_values;     // default: i % 3
  int64_t num_classes_attr = -1;         // -1: no attribute
  int64_t nan_row = -1;                  // >= 0: that row of /features is NaN
  std::vector<uint64_t> volumes_shape;   // float32 /volumes, contiguous
  std::vector<uint64_t> masks_shape;     // uint8 /masks: voxel i is i % 2,
  uint8_t mask_max = 1;                  // ... except the last: mask_max
};
void write_raw_h5(const std::string& path, const RawH5& spec);

// Replaces dataset `name` of the HDF5 file `path` (removes it with empty
// `dims`) by a contiguous one, without a checksum, of `file_type` (an HDF5
// type id; default H5T_STD_I64LE) holding `values`.
void put_int64_dataset(
    const std::string& path,
    const char* name,
    const std::vector<uint64_t>& dims,
    const std::vector<int64_t>& values,
    int64_t file_type = -1);

// The memtrain::Error H5Dataset::open(path, "data.train") throws ("" if
// it opens).
std::string open_error(const std::string& path);

// The message of the memtrain::Error that `f` throws ("" if none).
std::string error_of(const std::function<void()>& f);

// Runs this test binary again with only `test` (a full name), in a fresh
// process whose main installs no CPU allocator and starts no MPI
// (MEMTRAIN_TEST_OWN_PROCESS, test_main.cpp): for a test that chooses its
// device as memtrain does. Returns its exit status (-1: it did not start
// or did not exit).
int run_in_own_process(const std::string& test);

// The CPU placement (accounting allocator), shared by the tests.
const Placement& cpu_placement();

}  // namespace memtrain::test
