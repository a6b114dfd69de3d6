// The one case-listing rule of convert-dataset and predict
// (convert/nifti_cases.h): endings, hidden files, nnU-Net channel files,
// order, and what is refused.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "memtrain/convert/nifti_cases.h"
#include "memtrain/util/error.h"
#include "test_support.h"

namespace memtrain {
namespace {

namespace fs = std::filesystem;
using test::error_of;

void touch(const test::TempDir& d, const std::string& name) {
  std::ofstream(d.file(name)) << "x";
}

TEST(NiftiCases, StemsAndChannels) {
  EXPECT_EQ(nifti_stem("a.nii.gz"), "a");
  EXPECT_EQ(nifti_stem("a.nii"), "a");
  EXPECT_EQ(nifti_stem("a.b.nii.gz"), "a.b");
  EXPECT_EQ(nifti_stem(".nii.gz"), "");
  EXPECT_EQ(nifti_stem("a.nii.gz.bak"), "");
  EXPECT_EQ(nifti_stem("a.NII.GZ"), "");
  std::string base = "untouched";
  EXPECT_EQ(nnunet_channel("case_0003", &base), 3);
  EXPECT_EQ(base, "case");
  EXPECT_EQ(nnunet_channel("x_0000_0001", &base), 1);
  EXPECT_EQ(base, "x_0000");
  base = "untouched";
  EXPECT_EQ(nnunet_channel("case_003", &base), -1);
  EXPECT_EQ(nnunet_channel("case-0003", &base), -1);
  EXPECT_EQ(nnunet_channel("_0003", &base), -1);
  EXPECT_EQ(base, "untouched");
}

TEST(NiftiCases, IndexGroupsChannelsAndSkipsHiddenAndOtherFiles) {
  test::TempDir d("nifti-cases");
  for (const char* n :
       {"b_0001.nii",
        "b_0000.nii.gz",
        "a.nii.gz",
        "._a.nii.gz",
        "notes.txt",
        ".nii.gz",
        "c_0000.nii.gz"})
    touch(d, n);
  const NiftiFolder ix = index_nifti_folder(d.path(), OddEntry::kRefuse, "t");
  EXPECT_EQ(ix.names(), (std::vector<std::string>{"a", "b", "c"}));
  ASSERT_EQ(ix.single.size(), 1u);
  EXPECT_EQ(ix.single.at("a"), d.file("a.nii.gz"));
  ASSERT_EQ(ix.channels.at("b").size(), 2u);
  EXPECT_EQ(ix.channels.at("b").at(0), d.file("b_0000.nii.gz"));
  EXPECT_EQ(ix.channels.at("b").at(1), d.file("b_0001.nii"));
  // No such folder: nothing listed.
  EXPECT_TRUE(index_nifti_folder(d.file("none"), OddEntry::kRefuse, "t")
                  .names()
                  .empty());
}

TEST(NiftiCases, OneStemWithBothEndingsIsRefused) {
  test::TempDir d("nifti-twins");
  touch(d, "x_0000.nii");
  touch(d, "x_0000.nii.gz");
  const std::string e = error_of([&] {
    index_nifti_folder(d.path(), OddEntry::kSkip, "convert-dataset");
  });
  EXPECT_NE(
      e.find(
          "convert-dataset: '" + d.file("x_0000.nii") + "' and '" +
          d.file("x_0000.nii.gz") +
          "' are both case x's channel 0 file; keep one"),
      std::string::npos)
      << e;
  test::TempDir s("nifti-twins-single");
  touch(s, "y.nii.gz");
  touch(s, "y.nii");
  EXPECT_NE(
      error_of([&] {
        input_cases(s.path(), "predict");
      }).find("are both case y's file"),
      std::string::npos);
}

TEST(NiftiCases, OddEntriesAreRefusedOrSkipped) {
  test::TempDir d("nifti-odd");
  touch(d, "a_0000.nii.gz");
  fs::create_directory(d.file("b_0000.nii.gz"));
  ASSERT_EQ(::symlink("loop.nii.gz", d.file("loop.nii.gz").c_str()), 0);
  ASSERT_EQ(::symlink("gone", d.file("dead.nii").c_str()), 0);
  ASSERT_EQ(::mkfifo(d.file("f_0000.nii.gz").c_str(), 0600), 0);
  const NiftiFolder skip = index_nifti_folder(d.path(), OddEntry::kSkip, "t");
  EXPECT_EQ(skip.names(), (std::vector<std::string>{"a"}));
  const std::string e =
      error_of([&] { index_nifti_folder(d.path(), OddEntry::kRefuse, "t"); });
  EXPECT_NE(e.find("(a case file is expected there"), std::string::npos) << e;
  // Each odd entry alone is refused, with its own words.
  const std::vector<std::pair<std::string, std::string>> odd = {
      {"b_0000.nii.gz", " is a directory, not a file"},
      {"loop.nii.gz", ": a symbolic link loop"},
      {"dead.nii", ": a broken symbolic link"},
      {"f_0000.nii.gz", ": a FIFO, not a regular file"}};
  for (const auto& [name, words] : odd) {
    test::TempDir one("nifti-odd-one");
    fs::rename(d.file(name), one.file(name));
    const std::string why =
        error_of([&] { input_cases(one.path(), "predict"); });
    EXPECT_NE(
        why.find("predict: '" + one.file(name) + "'" + words),
        std::string::npos)
        << name << ": " << why;
    EXPECT_EQ(
        index_nifti_folder(one.path(), OddEntry::kSkip, "t").names().size(),
        0u);
  }
}

TEST(NiftiCases, InputCasesInNameOrderWithChannelsInOrder) {
  test::TempDir d("nifti-input");
  // Interleaved in path order: x_0000, x_0000_0000, x_0001.
  for (const char* n :
       {"x_0001.nii.gz",
        "x_0000_0000.nii.gz",
        "x_0000.nii.gz",
        "a.b.nii",
        "a_0000.nii.gz"})
    touch(d, n);
  const std::vector<InputCase> c = input_cases(d.path(), "predict");
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0].name, "a");
  EXPECT_EQ(c[0].files, (std::vector<std::string>{d.file("a_0000.nii.gz")}));
  EXPECT_EQ(c[1].name, "a.b");
  EXPECT_EQ(c[2].name, "x");
  EXPECT_EQ(
      c[2].files,
      (std::vector<std::string>{
          d.file("x_0000.nii.gz"), d.file("x_0001.nii.gz")}));
  EXPECT_EQ(c[3].name, "x_0000");
  EXPECT_EQ(
      c[3].files, (std::vector<std::string>{d.file("x_0000_0000.nii.gz")}));
}

TEST(NiftiCases, InputCasesRefusals) {
  test::TempDir d("nifti-input-bad");
  EXPECT_NE(
      error_of([&] { input_cases(d.path(), "predict"); })
          .find(
              "predict: --input '" + d.path() +
              "' holds no .nii or .nii.gz file"),
      std::string::npos);
  EXPECT_NE(
      error_of([&] {
        input_cases(d.file("none.nii.gz"), "predict");
      }).find("no such file or folder"),
      std::string::npos);
  touch(d, "notes.txt");
  EXPECT_NE(
      error_of([&] {
        input_cases(d.file("notes.txt"), "predict");
      }).find("is not a .nii or .nii.gz file"),
      std::string::npos);
  ASSERT_EQ(::symlink("l.nii.gz", d.file("l.nii.gz").c_str()), 0);
  EXPECT_NE(
      error_of([&] { input_cases(d.file("l.nii.gz"), "predict"); })
          .find(
              "predict: --input '" + d.file("l.nii.gz") +
              "': a symbolic link loop"),
      std::string::npos);
  fs::remove(d.file("l.nii.gz"));
  touch(d, "g_0000.nii.gz");
  touch(d, "g_0002.nii.gz");
  EXPECT_NE(
      error_of([&] {
        input_cases(d.path(), "predict");
      }).find("case 'g' has g_0002.nii.gz but no channel 1 file before it"),
      std::string::npos);
  fs::remove(d.file("g_0002.nii.gz"));
  touch(d, "g.nii");
  EXPECT_NE(
      error_of([&] {
        input_cases(d.path(), "predict");
      }).find("holds two cases named 'g' (g.nii and g_0000.nii.gz)"),
      std::string::npos);
  // One file: CASE_0000 names case CASE, any other channel keeps its stem.
  EXPECT_EQ(input_cases(d.file("g_0000.nii.gz"), "predict")[0].name, "g");
  touch(d, "h_0001.nii.gz");
  EXPECT_EQ(input_cases(d.file("h_0001.nii.gz"), "predict")[0].name, "h_0001");
}

}  // namespace
}  // namespace memtrain
