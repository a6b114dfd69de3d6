// convert-dataset's refusals of dataset.json itself (issue 56, point 6),
// before any case file is opened: a key written twice; numTraining and
// numTest against the cases listed or found.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "memtrain/convert/dataset_convert.h"
#include "memtrain/util/error.h"
#include "test_support.h"

namespace memtrain {
namespace {

using test::error_of;

// A folder holding only dataset.json = `json`; the error of converting it.
std::string refusal(const test::TempDir& d, const std::string& json) {
  std::ofstream(d.file("dataset.json")) << json;
  DatasetConvertSpec spec;
  spec.folder = d.path();
  spec.out = d.file("out/ds");
  const std::string e = error_of([&] { convert_dataset(spec); });
  EXPECT_FALSE(std::filesystem::exists(d.file("out")));
  return e;
}

TEST(DatasetConvert, KeyWrittenTwiceInDatasetJsonIsRefused) {
  test::TempDir d("dataset-json");
  const std::string where =
      "convert-dataset: dataset.json '" + d.file("dataset.json") + "': ";
  EXPECT_EQ(
      refusal(
          d,
          R"({"channel_names": {"0": "T1"}, "labels": {"background": 0,)"
          R"( "fg": 1}, "labels": {"background": 0, "fg": 1}})"),
      where +
          "key \"labels\" is written twice in the top-level object (a JSON "
          "reader keeps the last silently); keep one");
  EXPECT_EQ(
      refusal(
          d,
          R"({"channel_names": {"0": "T1", "0": "CT"}, "labels":)"
          R"( {"background": 0, "fg": 1}})"),
      where +
          "key \"0\" is written twice in object .channel_names (a JSON "
          "reader keeps the last silently); keep one");
  EXPECT_EQ(
      refusal(
          d,
          R"({"modality": {"0": "T1"}, "labels": {"0": "background", "1":)"
          R"( "fg"}, "training": [{"image": "./imagesTr/a.nii.gz", "label":)"
          R"( "./labelsTr/a.nii.gz", "label": "./labelsTr/b.nii.gz"}]})"),
      where +
          "key \"label\" is written twice in object .training[0] (a JSON "
          "reader keeps the last silently); keep one");
}

// Empty case files: the counts are checked before any header is read.
void touch_cases(const test::TempDir& d, const char* folder, int n) {
  std::filesystem::create_directories(d.file(folder));
  for (int i = 0; i < n; ++i)
    std::ofstream(d.file(folder) + "/c" + std::to_string(i) + "_0000.nii.gz");
}

TEST(DatasetConvert, CountsDisagreeingWithTheCasesAreRefused) {
  test::TempDir d("dataset-counts");
  touch_cases(d, "imagesTr", 3);
  std::filesystem::create_directories(d.file("labelsTr"));
  for (int i = 0; i < 3; ++i)
    std::ofstream(d.file("labelsTr/c" + std::to_string(i) + ".nii.gz"));
  const std::string where =
      "convert-dataset: '" + d.file("dataset.json") + "': ";
  const std::string nn =
      R"({"channel_names": {"0": "T1"}, "labels": {"background": 0, "fg": 1})";
  // nnU-Net v2: the cases are those of imagesTr/.
  EXPECT_EQ(
      refusal(d, nn + R"(, "numTraining": 4})"),
      where +
          "numTraining is 4 but imagesTr/ holds 3 case(s); a case is missing "
          "or extra in imagesTr/ (CASE_0000.nii.gz or CASE.nii.gz files), or "
          "numTraining is wrong");
  EXPECT_EQ(
      refusal(d, nn + R"(, "numTraining": "3"})"),
      where +
          "\"numTraining\" is \"3\", not a count of cases (a whole number "
          ">= 0)");
  // MSD: the cases are those "training" lists.
  std::string listed = R"(, "training": [)";
  for (int i = 0; i < 3; ++i)
    listed += std::string(i ? ", " : "") + R"({"image": "./imagesTr/c)" +
              std::to_string(i) + R"(.nii.gz", "label": "./labelsTr/c)" +
              std::to_string(i) + R"(.nii.gz"})";
  listed += "]";
  EXPECT_EQ(
      refusal(d, nn + listed + R"(, "numTraining": 2})"),
      where +
          "numTraining is 2 but its \"training\" list has 3 case(s); "
          "correct numTraining or the list");
  // numTest: against the "test" list, and imagesTs/ when it is there.
  EXPECT_EQ(
      refusal(
          d,
          nn + listed +
              R"(, "numTraining": 3, "numTest": 2, "test": ["./imagesTs/t.nii.gz"]})"),
      where +
          "numTest is 2 but its \"test\" list has 1 case(s); correct numTest "
          "or the list");
  touch_cases(d, "imagesTs", 1);
  EXPECT_EQ(
      refusal(d, nn + R"(, "numTraining": 3, "numTest": 2})"),
      where +
          "numTest is 2 but imagesTs/ holds 1 case(s); a test case is missing "
          "or extra in imagesTs/, or numTest is wrong");
  // Counts that agree, or are absent, pass: a case's (empty) header is
  // what is refused then.
  for (const std::string& ok :
       {nn + "}",
        nn + R"(, "numTraining": 3, "numTest": 1})",
        nn + listed + R"(, "numTraining": 3, "numTest": 1, "test": ["x"]})"})
    EXPECT_NE(
        refusal(d, ok).find("not a NIfTI file: sizeof_hdr = (0 bytes)"),
        std::string::npos)
        << ok;
}

}  // namespace
}  // namespace memtrain
