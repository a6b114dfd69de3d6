// memtrain convert-captions: the rules a row of its CSV must meet
// (src/convert/caption_csv.h), each refusal's message exact and nothing
// written. The CSV is read before the BPE vocabulary, so a CSV that passes
// stops at --bpe naming a missing file: these tests need no open_clip.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "memtrain/convert/caption_convert.h"
#include "test_support.h"

namespace memtrain {
namespace {
namespace fs = std::filesystem;

struct CaptionCsv : ::testing::Test {
  test::TempDir dir{"caption_csv"};

  // The message convert_captions gives for a CSV of `text` ("" if none).
  std::string error(const std::string& text, const std::string& root = "") {
    std::ofstream(dir.file("caps.csv"), std::ios::binary) << text;
    CaptionConvertSpec spec;
    spec.csv = dir.file("caps.csv");
    spec.images_root = root;
    spec.out = dir.file("out.h5");
    spec.bpe = dir.file("no-bpe.txt.gz");
    const std::string e = test::error_of([&] { convert_captions(spec); });
    EXPECT_FALSE(fs::exists(spec.out));
    const std::string where = "convert-captions: --csv '" + spec.csv + "'";
    return e.rfind(where, 0) == 0 ? "CSV" + e.substr(where.size()) : e;
  }
  // The CSV passed: the run went on to the vocabulary.
  bool passes(const std::string& text, const std::string& root = "") {
    return error(text, root).find("cannot open the CLIP BPE vocabulary") !=
           std::string::npos;
  }
};

TEST_F(CaptionCsv, CaptionMissingOrEmptyRefused) {
  const std::string nan =
      "pandas reads NaN, and open_clip trains on the caption 'nan'";
  EXPECT_EQ(
      error("filepath\ttitle\na.png\tcats\nb.png\n"),
      "CSV line 3, column 'title' (field 2): no caption (the row has 1 "
      "field(s), the header 2; " +
          nan +
          "): write the caption, separated by \\t (tab) (--sep), or delete "
          "the row");
  for (const char* empty : {"b.png\t\n", "b.png\t\"\"\n"})
    EXPECT_EQ(
        error(std::string("filepath\ttitle\na.png\t\"x\ny\"\n") + empty),
        "CSV line 4, column 'title' (field 2): empty caption (" + nan +
            "): write the caption, or delete the row");
  // A caption of a space is text, to pandas too.
  EXPECT_TRUE(passes("filepath\ttitle\na.png\t \n"));
}

TEST_F(CaptionCsv, KeyColumnNamedTwiceRefused) {
  EXPECT_EQ(
      error("title\tfilepath\ttitle\ncats\ta.png\tdogs\n"),
      "CSV line 1, column 'title' (field 3): the header names the column "
      "'title' (--caption-key) again, first as field 1 (pandas reads this one "
      "as 'title.1'); rename one, or pass --caption-key NAME");
  EXPECT_EQ(
      error("filepath\tfilepath\ttitle\na.png\tb.png\tcats\n"),
      "CSV line 1, column 'filepath' (field 2): the header names the column "
      "'filepath' (--img-key) again, first as field 1 (pandas reads this one "
      "as 'filepath.1'); rename one, or pass --img-key NAME");
  // Another column twice is no concern of ours.
  EXPECT_TRUE(passes("filepath\tx\ttitle\tx\na.png\t1\tcats\t2\n"));
}

TEST_F(CaptionCsv, OneColumnForPathsAndCaptionsRefused) {
  std::ofstream(dir.file("caps.csv")) << "filepath\ttitle\na.png\tcats\n";
  CaptionConvertSpec spec;
  spec.csv = dir.file("caps.csv");
  spec.out = dir.file("out.h5");
  spec.img_key = spec.caption_key = "title";
  EXPECT_EQ(
      test::error_of([&] { convert_captions(spec); }),
      "convert-captions: --img-key and --caption-key both name the column "
      "'title': the image paths and the captions are two columns; pass each "
      "its own");
  EXPECT_FALSE(fs::exists(spec.out));
}

TEST_F(CaptionCsv, PathLeavingImagesRootRefused) {
  const std::string root = dir.file("imgs");
  auto leaves = [&](int line, const std::string& path) {
    return "CSV line " + std::to_string(line) +
           ", column 'filepath' (field 1): '" + path +
           "' leaves --images-root '" + root +
           "' (relative image paths are below it): fix the path, pass the "
           "folder it is below as --images-root, or write it absolute";
  };
  EXPECT_EQ(
      error("filepath\ttitle\na.png\tcats\n../b.png\tdogs\n", root),
      leaves(3, "../b.png"));
  EXPECT_EQ(
      error("filepath\ttitle\nsub/../../b.png\tdogs\n", root),
      leaves(2, "sub/../../b.png"));
  // Below the root once normalised; absolute (read as written); no
  // --images-root: paths from the current folder, as open_clip opens them.
  EXPECT_TRUE(passes("filepath\ttitle\nsub/../b.png\tdogs\n", root));
  EXPECT_TRUE(passes("filepath\ttitle\n/x/../b.png\tdogs\n", root));
  EXPECT_TRUE(passes("filepath\ttitle\n../b.png\tdogs\n"));
}

}  // namespace
}  // namespace memtrain
