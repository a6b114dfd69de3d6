// The CSV reader of convert-captions (formats/text/csv_table.h): pandas'
// quoting, and what it refuses where pandas would give other data than the
// file says (a NUL byte, text after a closing quote: an unclosed quote),
// each message exact: the line where the record (or the quote) starts and
// the column.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "memtrain/formats/text/csv_table.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

using S = std::vector<std::string>;

std::string error_of(const std::string& text, char sep = '\t') {
  try {
    parse_csv(text, sep, "t.csv");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CsvTable, PandasQuoting) {
  const std::string text =
      "\xEF\xBB\xBF"
      "filepath\ttitle\n"
      "a.jpg\tplain \"inner\" quote\n"
      "\n"
      "b.jpg\t\"tab\there and\nnewline, \"\"doubled\"\"\"\r\n"
      "c.jpg\t\"\"\n"
      "d.jpg\r"
      "   \n"
      "e.jpg\t\"x\"\n";
  const CsvTable t = parse_csv(text, '\t', "t.csv");
  EXPECT_EQ(t.header, (S{"filepath", "title"}));
  ASSERT_EQ(t.rows.size(), 5u);
  EXPECT_EQ(t.rows[0].line, 2);
  EXPECT_EQ(t.rows[0].fields[1], "plain \"inner\" quote");
  EXPECT_EQ(t.rows[1].line, 4);
  EXPECT_EQ(t.rows[1].fields[1], "tab\there and\nnewline, \"doubled\"");
  EXPECT_EQ(t.rows[2].line, 6);
  EXPECT_EQ(t.rows[2].fields[1], "");
  EXPECT_EQ(t.rows[3].line, 7);
  EXPECT_EQ(t.rows[3].fields, (S{"d.jpg"}));
  EXPECT_EQ(t.rows[4].line, 9);
  EXPECT_EQ(t.rows[4].fields, (S{"e.jpg", "x"}));
}

TEST(CsvTable, TooManyFields) {
  EXPECT_EQ(
      error_of("a,b\n1,2,3\n", ','),
      "t.csv line 2: 3 fields, the header has 2 (is the separator right? a "
      "field that holds the separator must be quoted: \"...\")");
  EXPECT_EQ(error_of(""), "t.csv: no header row (the file is empty)");
}

TEST(CsvTable, NulByteRefusedNamingLineAndColumn) {
  const std::string nul(1, '\0');
  const std::string tail =
      ": a NUL byte (\\0); a text CSV holds none (is it UTF-16, or not "
      "text?): remove it, or save the file as UTF-8";
  // In a path: a C string would end there and name another file.
  EXPECT_EQ(
      error_of("filepath\ttitle\na.png" + nul + "b.png\tcats\n"),
      "t.csv line 2, column 'filepath' (field 1)" + tail);
  // In a caption, after a row of two lines: the line the row starts on.
  EXPECT_EQ(
      error_of(
          "filepath\ttitle\na.png\t\"two\nlines\"\nb.png\ttwo" + nul +
          "cats\n"),
      "t.csv line 4, column 'title' (field 2)" + tail);
  // Inside a quoted field, on its second line.
  EXPECT_EQ(
      error_of("filepath\ttitle\na.png\t\"two\nli" + nul + "nes\"\n"),
      "t.csv line 3, column 'title' (field 2)" + tail);
  // A field of only a NUL, and one past the header.
  EXPECT_EQ(
      error_of("filepath\ttitle\n" + nul + "\tcats\n"),
      "t.csv line 2, column 'filepath' (field 1)" + tail);
  EXPECT_EQ(
      error_of("filepath\ttitle\na.png\tcats\t" + nul + "\n"),
      "t.csv line 2, field 3" + tail);
  // In the header (UTF-16 text is full of them).
  EXPECT_EQ(
      error_of("\xFF\xFE" + std::string("f") + nul + "i\n"),
      "t.csv line 1, field 1" + tail);
}

TEST(CsvTable, UnclosedQuoteRefusedAtTheLineItOpened) {
  // pandas closes it at the next quote, two lines on, and joins the rows
  // between into the caption.
  EXPECT_EQ(
      error_of("filepath\ttitle\na.png\tcats\nb.png\t\"dogs\nc.png\tbirds\n"
               "d.png\tsay \"hi\"\n"),
      "t.csv line 3, column 'title' (field 2): the quote (\") opened on this "
      "line is not closed on it; the next quote, on line 5, would end the "
      "field with text after it, joining the rows between into this field; "
      "close the quote (inner quotes doubled: \"\")");
  // No quote after it at all.
  EXPECT_EQ(
      error_of("filepath\ttitle\na.png\t\"dogs\nb.png\tbirds\n"),
      "t.csv line 2, column 'title' (field 2): a quoted field (\") is not "
      "closed before the end of the file; close it, or double the quotes "
      "inside it (\"\")");
  // Text after the closing quote on the same line: pandas drops the quotes
  // ("a"b -> ab).
  EXPECT_EQ(
      error_of("filepath\ttitle\na.png\t\"Starry Night\" by Van Gogh\n"),
      "t.csv line 2, column 'title' (field 2): text after the closing quote "
      "(\"...\"x); a field that starts with \" is quoted up to the next "
      "single \": quote the whole field and double the quotes inside it "
      "(\"\"\"a\"\" b\")");
  EXPECT_EQ(
      error_of("\"file\"path,title\n", ','),
      "t.csv line 1, field 1: text after the closing quote (\"...\"x); a "
      "field that starts with \" is quoted up to the next single \": quote "
      "the whole field and double the quotes inside it (\"\"\"a\"\" b\")");
  // A quoted field of several lines closed before the separator, a line end
  // or the end of the file is one field.
  const CsvTable t = parse_csv(
      "filepath,title\n\"a\nb.png\",\"one\r\ntwo\"\nc.png,\"x\"", ',', "t");
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_EQ(t.rows[0].fields, (S{"a\nb.png", "one\r\ntwo"}));
  EXPECT_EQ(t.rows[1].line, 5);
  EXPECT_EQ(t.rows[1].fields, (S{"c.png", "x"}));
}

}  // namespace
}  // namespace memtrain
