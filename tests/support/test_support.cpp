#include "test_support.h"

#include <memory>

#include "memtrain/device/placement.h"

#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/util/error.h"

#include <hdf5.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace memtrain::test {

TempDir::TempDir(const std::string& name) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl =
      std::string(base ? base : "/tmp") + "/memtrain-" + name + "-XXXXXX";
  if (!::mkdtemp(tmpl.data()))
    throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

namespace {
void write(
    hid_t file,
    const char* name,
    const std::vector<uint64_t>& shape,
    hid_t file_type,
    hid_t mem_type,
    const void* data) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  const hid_t space =
      H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  const hid_t ds = H5Dcreate2(
      file, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  H5Dclose(ds);
  H5Sclose(space);
}

size_t count(const std::vector<uint64_t>& shape) {
  size_t n = 1;
  for (auto d : shape)
    n *= d;
  return n;
}
}  // namespace

void write_raw_h5(const std::string& path, const RawH5& spec) {
  const hid_t f =
      H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0)
    throw std::runtime_error("cannot create " + path);
  if (!spec.features_shape.empty()) {
    std::vector<float> v(count(spec.features_shape), 0.5f);
    // A learnable signal: feature 0 carries the label.
    const size_t width =
        spec.features_shape.size() > 1 ? spec.features_shape[1] : 1;
    for (size_t i = 0; i < v.size() / width; ++i)
      v[i * width] = float(i % 3);
    if (spec.nan_row >= 0) {
      for (size_t j = 0; j < width; ++j)
        v[spec.nan_row * width + j] = NAN;
    }
    std::vector<int32_t> iv(v.size(), 1);
    if (spec.features_as_int) {
      write(
          f,
          "features",
          spec.features_shape,
          H5T_STD_I32LE,
          H5T_NATIVE_INT32,
          iv.data());
    } else {
      write(
          f,
          "features",
          spec.features_shape,
          H5T_IEEE_F32LE,
          H5T_NATIVE_FLOAT,
          v.data());
    }
  }
  if (!spec.images_shape.empty()) {
    std::vector<float> v(count(spec.images_shape), 0.25f);
    write(
        f,
        "images",
        spec.images_shape,
        H5T_IEEE_F32LE,
        H5T_NATIVE_FLOAT,
        v.data());
  }
  if (!spec.volumes_shape.empty()) {
    std::vector<float> v(count(spec.volumes_shape));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = float(i % 7);
    write(
        f,
        "volumes",
        spec.volumes_shape,
        H5T_IEEE_F32LE,
        H5T_NATIVE_FLOAT,
        v.data());
  }
  if (!spec.masks_shape.empty()) {
    std::vector<uint8_t> m(count(spec.masks_shape));
    for (size_t i = 0; i < m.size(); ++i)
      m[i] = uint8_t(i % 2);
    m.back() = spec.mask_max;
    write(
        f, "masks", spec.masks_shape, H5T_STD_U8LE, H5T_NATIVE_UINT8, m.data());
  }
  if (!spec.labels_shape.empty()) {
    const size_t n = count(spec.labels_shape);
    std::vector<int64_t> l(n);
    for (size_t i = 0; i < n; ++i) {
      l[i] = i < spec.label_values.size() ? spec.label_values[i]
                                          : static_cast<int64_t>(i % 3);
    }
    std::vector<float> lf(l.begin(), l.end());
    if (spec.labels_as_float) {
      write(
          f,
          "labels",
          spec.labels_shape,
          H5T_IEEE_F32LE,
          H5T_NATIVE_FLOAT,
          lf.data());
    } else {
      write(
          f,
          "labels",
          spec.labels_shape,
          H5T_STD_I64LE,
          H5T_NATIVE_INT64,
          l.data());
    }
  }
  if (spec.num_classes_attr >= 0) {
    const hid_t sp = H5Screate(H5S_SCALAR);
    const hid_t a = H5Acreate2(
        f, "num_classes", H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, &spec.num_classes_attr);
    H5Aclose(a);
    H5Sclose(sp);
  }
  H5Fclose(f);
}

std::string open_error(const std::string& path) {
  try {
    H5Dataset::open(path, "data.train");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const Placement& cpu_placement() {
  static const std::unique_ptr<Placement> p = Placement::cpu();
  return *p;
}

void put_int64_dataset(
    const std::string& path,
    const char* name,
    const std::vector<uint64_t>& dims,
    const std::vector<int64_t>& values,
    int64_t file_type) {
  const hid_t type =
      file_type < 0 ? H5T_STD_I64LE : static_cast<hid_t>(file_type);
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (f < 0)
    throw std::runtime_error("put_int64_dataset: cannot open " + path);
  if (H5Lexists(f, name, H5P_DEFAULT) > 0)
    H5Ldelete(f, name, H5P_DEFAULT);
  if (!dims.empty()) {
    std::vector<hsize_t> d(dims.begin(), dims.end());
    const hid_t sp = H5Screate_simple(int(d.size()), d.data(), nullptr);
    const hid_t ds =
        H5Dcreate2(f, name, type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(
        ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
    H5Dclose(ds);
    H5Sclose(sp);
  }
  H5Fclose(f);
}

int run_in_own_process(const std::string& test) {
  const std::string filter = "--gtest_filter=" + test;
  char exe[] = "/proc/self/exe";
  std::vector<char*> argv = {exe, const_cast<char*>(filter.c_str()), nullptr};
  std::vector<std::string> env_text = {"MEMTRAIN_TEST_OWN_PROCESS=1"};
  for (char** e = environ; *e != nullptr; ++e)
    env_text.emplace_back(*e);
  std::vector<char*> env;
  for (auto& e : env_text)
    env.push_back(e.data());
  env.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, exe, nullptr, nullptr, argv.data(), env.data()) != 0)
    return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
    return -1;
  return WEXITSTATUS(status);
}

}  // namespace memtrain::test
