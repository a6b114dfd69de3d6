// convert-captions' CSV and the rules of its rows: see caption_csv.h.

#include "convert/caption_csv.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "memtrain/formats/text/csv_table.h"
#include "memtrain/util/error.h"
#include "memtrain/util/file_kind.h"

namespace memtrain {
namespace fs = std::filesystem;
namespace {

constexpr const char* kCmd = "convert-captions";

std::string read_csv_file(const std::string& path) {
  const std::string kind = not_a_regular_file(path);
  MT_CHECK(kind.empty(), kCmd, ": --csv '", path, "': ", kind);
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  MT_CHECK(
      in.good() || in.eof(),
      kCmd,
      ": --csv '",
      path,
      "': cannot read: ",
      std::strerror(errno));
  return text.str();
}

// The column `key` of the header; a clear refusal naming the columns found,
// or the two fields of a name given twice.
size_t column(
    const std::vector<std::string>& header,
    const std::string& key,
    const char* flag,
    const CaptionConvertSpec& spec,
    const std::string& where) {
  const auto it = std::find(header.begin(), header.end(), key);
  if (it != header.end()) {
    const auto again = std::find(it + 1, header.end(), key);
    MT_CHECK(
        again == header.end(),
        csv_position(
            where, header, 1, static_cast<size_t>(again - header.begin())),
        ": the header names the column '",
        key,
        "' (",
        flag,
        ") again, first as field ",
        it - header.begin() + 1,
        " (pandas reads this one as '",
        key,
        ".1'); rename one, or pass ",
        flag,
        " NAME");
    return static_cast<size_t>(it - header.begin());
  }
  std::string found;
  for (const std::string& h : header)
    found += (found.empty() ? "'" : ", '") + h + "'";
  std::string hint;
  if (header.size() == 1)
    for (char c : {',', '\t', ';', '|'})
      if (c != spec.sep && header[0].find(c) != std::string::npos) {
        hint = std::string("; the header has one column holding '") +
               (c == '\t' ? "\\t" : std::string(1, c)) + "': try --sep " +
               (c == '\t' ? "'\\t'" : std::string(1, c));
        break;
      }
  throw Error(
      std::string(kCmd) + ": --csv '" + spec.csv + "' has no column '" + key +
      "' (" + flag + "); its header (separator " + sep_name(spec.sep) +
      ", --sep) has " + std::to_string(header.size()) + " column(s): " + found +
      "; pass " + flag + " NAME" + hint);
}

}  // namespace

std::string sep_name(char sep) {
  return sep == '\t' ? std::string("\\t (tab)") : std::string(1, sep);
}

std::vector<CaptionCsvRow> read_caption_csv(const CaptionConvertSpec& spec) {
  const std::string where = std::string(kCmd) + ": --csv '" + spec.csv + "'";
  MT_CHECK(
      spec.img_key != spec.caption_key,
      kCmd,
      ": --img-key and --caption-key both name the column '",
      spec.img_key,
      "': the image paths and the captions are two columns; pass each its "
      "own");
  size_t path_col = 0, cap_col = 0;
  const CsvTable table = parse_csv(
      read_csv_file(spec.csv),
      spec.sep,
      where,
      [&](const std::vector<std::string>& header) {
        path_col = column(header, spec.img_key, "--img-key", spec, where);
        cap_col =
            column(header, spec.caption_key, "--caption-key", spec, where);
      });
  std::vector<CaptionCsvRow> rows;
  for (const CsvRecord& rec : table.rows) {
    CaptionCsvRow row;
    row.line = rec.line;
    const auto at = [&](size_t col) {
      return csv_position(where, table.header, rec.line, col);
    };
    // pandas reads a missing or empty cell as NaN; open_clip's str() makes
    // it the caption "nan".
    MT_CHECK(
        cap_col < rec.fields.size(),
        at(cap_col),
        ": no caption (the row has ",
        rec.fields.size(),
        " field(s), the header ",
        table.header.size(),
        "; pandas reads NaN, and open_clip trains on the caption 'nan'): "
        "write the caption, separated by ",
        sep_name(spec.sep),
        " (--sep), or delete the row");
    row.caption = rec.fields[cap_col];
    MT_CHECK(
        !row.caption.empty(),
        at(cap_col),
        ": empty caption (pandas reads NaN, and open_clip trains on the "
        "caption 'nan'): write the caption, or delete the row");
    if (path_col < rec.fields.size())
      row.path = rec.fields[path_col];
    const fs::path p(row.path);
    if (!spec.images_root.empty() && !row.path.empty() && p.is_relative()) {
      const fs::path normal = p.lexically_normal();
      MT_CHECK(
          normal.empty() || *normal.begin() != "..",
          at(path_col),
          ": '",
          row.path,
          "' leaves --images-root '",
          spec.images_root,
          "' (relative image paths are below it): fix the path, pass the "
          "folder it is below as --images-root, or write it absolute");
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace memtrain
