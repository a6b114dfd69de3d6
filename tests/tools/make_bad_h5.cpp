// make_bad_h5 CASE OUT.h5: writes one kind of broken dataset file for the
// end-to-end bad-input tests (HDF5 C API, no h5py needed). The files have
// no checksums (contiguous datasets, as other tools write them).
// make_bad_h5 chunk-offset FILE.h5 DATASET INDEX: prints "OFFSET SIZE", the
// file offset and stored size of chunk INDEX of DATASET (to damage it).
// Cases: wrong-rank, wrong-dtype, length-mismatch, nan, no-checksum,
// contiguous-volumes, empty, mask-shape, mask-range, declared-huge.

#include <hdf5.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "test_support.h"

namespace {
int chunk_offset(const char* path, const char* name, const char* index) {
  const hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t ds = f >= 0 ? H5Dopen2(f, name, H5P_DEFAULT) : -1;
  if (ds < 0) {
    std::fprintf(stderr, "cannot open %s in %s\n", name, path);
    return 2;
  }
  const hid_t space = H5Dget_space(ds);
  std::vector<hsize_t> offset(H5Sget_simple_extent_ndims(space));
  unsigned mask = 0;
  haddr_t addr = 0;
  hsize_t size = 0;
  const herr_t rc = H5Dget_chunk_info(
      ds,
      space,
      std::strtoull(index, nullptr, 10),
      offset.data(),
      &mask,
      &addr,
      &size);
  H5Sclose(space);
  H5Dclose(ds);
  H5Fclose(f);
  if (rc < 0) {
    std::fprintf(stderr, "no chunk %s in %s\n", index, name);
    return 2;
  }
  std::printf(
      "%llu %llu\n", (unsigned long long)addr, (unsigned long long)size);
  return 0;
}
// /features [2^36, 16] float32 and /labels [2^36] int64, declared and
// never written (HDF5 allocates contiguous storage at the first write):
// 4 TiB declared in a file of a few KB.
int declared_huge(const char* path) {
  const hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0)
    return 2;
  const hsize_t rows = hsize_t{1} << 36;
  const hsize_t fdims[2] = {rows, 16};
  const hid_t fs = H5Screate_simple(2, fdims, nullptr);
  const hid_t ls = H5Screate_simple(1, &rows, nullptr);
  const hid_t a = H5Dcreate2(
      f, "features", H5T_IEEE_F32LE, fs, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  const hid_t b = H5Dcreate2(
      f, "labels", H5T_STD_I64LE, ls, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  const bool ok = a >= 0 && b >= 0;
  H5Dclose(a);
  H5Dclose(b);
  H5Sclose(fs);
  H5Sclose(ls);
  return H5Fclose(f) >= 0 && ok ? 0 : 2;
}
}  // namespace

int main(int argc, char** argv) {
  using memtrain::test::RawH5;
  if (argc == 5 && !std::strcmp(argv[1], "chunk-offset"))
    return chunk_offset(argv[2], argv[3], argv[4]);
  if (argc != 3) {
    std::fprintf(
        stderr,
        "usage: make_bad_h5 CASE OUT.h5 | chunk-offset FILE DATASET INDEX\n");
    return 2;
  }
  const char* c = argv[1];
  if (!std::strcmp(c, "declared-huge"))
    return declared_huge(argv[2]);
  RawH5 spec;
  if (!std::strcmp(c, "wrong-rank")) {
    spec = {{64, 4, 2}, {}, {64}};
  } else if (!std::strcmp(c, "wrong-dtype")) {
    spec = {{64, 4}, {}, {64}, /*labels_as_float=*/true};
  } else if (!std::strcmp(c, "length-mismatch")) {
    spec = {{64, 4}, {}, {60}};
  } else if (!std::strcmp(c, "nan")) {
    spec = {{64, 4}, {}, {64}};
    spec.nan_row = 5;  // one sample's features are NaN
  } else if (!std::strcmp(c, "no-checksum")) {
    spec = {{256, 4}, {}, {256}};  // a good file, without checksums
  } else if (!std::strcmp(c, "contiguous-volumes")) {
    // Good volumes [4, 1, 32, 32, 32], contiguous (and no checksums).
    spec.volumes_shape = {4, 1, 32, 32, 32};
    spec.masks_shape = {4, 32, 32, 32};
  } else if (!std::strcmp(c, "empty")) {
    spec = {{0, 4}, {}, {0}};
  } else if (!std::strcmp(c, "mask-shape")) {
    // /masks [2, 8, 8, 4] for /volumes [2, 1, 8, 8, 8]: W differs.
    spec.volumes_shape = {2, 1, 8, 8, 8};
    spec.masks_shape = {2, 8, 8, 4};
  } else if (!std::strcmp(c, "mask-range")) {
    // num_classes = 2, and the last voxel of the last mask is 5.
    spec.volumes_shape = {2, 1, 8, 8, 8};
    spec.masks_shape = {2, 8, 8, 8};
    spec.mask_max = 5;
    spec.num_classes_attr = 2;
  } else {
    std::fprintf(stderr, "unknown case %s\n", c);
    return 2;
  }
  memtrain::test::write_raw_h5(argv[2], spec);
  return 0;
}
