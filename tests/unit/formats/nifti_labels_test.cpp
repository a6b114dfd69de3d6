// The reference labels `memtrain predict --labels` scores against
// (read_nifti_case_labels, issue 56, point 6): only the model's classes;
// a class beyond them, a negative or a fractional value is refused naming
// the file, the first such voxel, its value, how many there are and the
// model's class count.

#include <gtest/gtest.h>
#include <nifti2_io.h>

#include <cstring>
#include <string>
#include <vector>

#include "memtrain/formats/nifti/nifti_volume.h"
#include "memtrain/util/error.h"
#include "test_support.h"

namespace memtrain {
namespace {

constexpr int64_t NX = 4, NY = 3, NZ = 2;

// A 4 x 3 x 2 NIfTI-1 file of `datatype` holding `values` (x fastest).
template <typename T>
void write_volume(
    const std::string& path, int datatype, const std::vector<T>& values) {
  const int64_t dims[8] = {3, NX, NY, NZ, 1, 1, 1, 1};
  nifti_image* im = nifti_make_new_nim(dims, datatype, 1);
  ASSERT_NE(im, nullptr);
  ASSERT_EQ(values.size(), im->nvox);
  std::memcpy(im->data, values.data(), values.size() * sizeof(T));
  ASSERT_EQ(nifti_set_filenames(im, path.c_str(), 0, 1), 0);
  nifti_image_write(im);
  nifti_image_free(im);
}

class NiftiLabels : public ::testing::Test {
 protected:
  test::TempDir dir{"nifti-labels"};
  const std::string img = dir.file("img.nii");
  const std::string lbl = dir.file("lbl.nii");

  void SetUp() override {
    write_volume(img, DT_FLOAT32, std::vector<float>(NX * NY * NZ, 1.0f));
  }
  // The labels 0, 1, 0, 1, ... with `value` at voxels `at`.
  template <typename T>
  void labels(int datatype, T value, const std::vector<int64_t>& at) {
    std::vector<T> v(NX * NY * NZ);
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<T>(i % 2);
    for (int64_t i : at)
      v[i] = value;
    write_volume(lbl, datatype, v);
  }
  std::vector<uint8_t> read(int64_t classes, const std::string& map = "") {
    return read_nifti_case_labels(
        "predict", "--labels", lbl, img, map, classes);
  }
  std::string refusal(int64_t classes, const std::string& map = "") {
    return test::error_of([&] { read(classes, map); });
  }
};

TEST_F(NiftiLabels, TheModelsClassesAreRead) {
  labels<int16_t>(DT_INT16, 1, {});
  const std::vector<uint8_t> v = read(2);
  ASSERT_EQ(v.size(), static_cast<size_t>(NX * NY * NZ));
  EXPECT_EQ(v[0], 0);
  EXPECT_EQ(v[1], 1);
  // 5 and 7 are classes of an 8-class model.
  labels<int16_t>(DT_INT16, 5, {21});
  EXPECT_EQ(read(8)[21], 5);
}

TEST_F(NiftiLabels, ClassesBeyondTheModelsAreRefused) {
  // Voxels (1,2,1) and (3,2,1) hold 5: beyond a 2-class model's.
  labels<int16_t>(DT_INT16, 5, {21, 23});
  const std::string where = "predict: --labels '" + lbl + "': voxel (1,2,1) ";
  EXPECT_EQ(
      refusal(2),
      where +
          "has label 5, not in the model's 2 classes (0..1); 2 voxel(s) have "
          "a label >= 2 (map them to the model's classes with --label-map)");
  EXPECT_EQ(
      refusal(2, "5:2,1:1"),
      where +
          "is mapped to class 2, not in the model's 2 classes (0..1); 2 "
          "voxel(s) have a class >= 2 (map them to the model's classes with "
          "--label-map)");
  EXPECT_EQ(read(2, ">0:1")[21], 1);
  labels<int16_t>(DT_INT16, -1, {21});
  EXPECT_EQ(
      refusal(2),
      where +
          "has label -1; without --label-map labels must be non-negative "
          "integers, here the model's 2 classes (0..1) (map them with "
          "--label-map)");
  labels<float>(DT_FLOAT32, 0.5f, {21});
  EXPECT_EQ(
      refusal(2),
      where +
          "has label 0.5; without --label-map labels must be non-negative "
          "integers, here the model's 2 classes (0..1) (map them with "
          "--label-map)");
}

}  // namespace
}  // namespace memtrain
