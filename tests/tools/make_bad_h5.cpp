// make_bad_h5 CASE OUT.h5: writes one kind of broken dataset file for the
// end-to-end bad-input tests (HDF5 C API, no h5py needed).

#include <cstdio>
#include <cstring>

#include "test_support.h"

int main(int argc, char** argv) {
  using memtrain::test::RawH5;
  if (argc != 3) {
    std::fprintf(stderr, "usage: make_bad_h5 CASE OUT.h5\n");
    return 2;
  }
  const char* c = argv[1];
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
