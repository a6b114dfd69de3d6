#pragma once
// Private to src/convert/: the rows of convert-captions' CSV
// (caption_convert.cpp writes them), read by formats/text/csv_table.h and
// held to the rules a row must meet.

#include <cstdint>
#include <string>
#include <vector>

#include "memtrain/convert/caption_convert.h"

namespace memtrain {

struct CaptionCsvRow {
  int64_t line = 0;     // where the row starts in the file (header: 1)
  std::string path;     // as the CSV writes it; "": none (skipped, named)
  std::string caption;  // never empty
};

// The separator as messages name it: "\t (tab)", else the character.
std::string sep_name(char sep);

// spec.csv's rows, in the file's order. Throws memtrain::Error, one line
// naming --csv, the line and the column, and what to do, on:
// - what parse_csv refuses (a NUL byte, an unclosed quote, ...);
// - a spec.img_key or spec.caption_key column the header lacks (the
//   columns found named) or names twice (pandas renames the second
//   'KEY.1': which one is meant is not known);
// - a row without its caption, or with an empty one: pandas reads NaN
//   and open_clip trains on the caption "nan";
// - with spec.images_root given, a relative image path that leaves it once
//   normalised ("../x.png", "a/../../x.png"): relative paths are below the
//   root. The check is on the path as written: an absolute path is read as
//   written, and symlinks below the root are followed, as open_clip does.
std::vector<CaptionCsvRow> read_caption_csv(const CaptionConvertSpec& spec);

}  // namespace memtrain
