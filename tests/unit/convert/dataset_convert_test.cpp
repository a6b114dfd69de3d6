// convert-dataset's refusals of dataset.json itself (issue 56, point 6),
// before any case file is opened: a key written twice.

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

}  // namespace
}  // namespace memtrain
