#pragma once
// A delimited text file read as pandas.read_csv(path, sep=SEP) reads it with
// its defaults (the C parser), as open_clip's CsvDataset does: the first
// record is the header; quotechar '"' opens a quoted field only at the start
// of a field, a doubled quote inside it is one quote, separators and line
// breaks inside it are kept; a quote inside an unquoted field is an
// ordinary character; records end at \n, \r\n or \r; empty lines and lines
// of only spaces (and tabs, when the separator is not a tab) are skipped; a
// UTF-8 byte order mark at the start is dropped.
// Stricter than pandas, where pandas gives other data than the file says:
// - a NUL byte anywhere is refused (a C string ends there, so a path would
//   name another file; pandas' C parser has cut fields at it, or read them
//   as NaN, depending on its version);
// - text after a closing quote is refused: pandas goes on unquoted ("a"b ->
//   ab), which after an unclosed quote joins every row up to the next quote
//   into one field. The message names the line where the quote opened.
// Unlike pandas, fields stay text: an empty field is "" (pandas: NaN, which
// open_clip's str() turns into "nan"), "NA", "null" or "1.50" stay as written.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace memtrain {

struct CsvRecord {
  int64_t line = 0;  // 1-based line of the file where the record starts
  std::vector<std::string> fields;
};

struct CsvTable {
  std::vector<std::string> header;
  std::vector<CsvRecord> rows;  // each with at most header.size() fields
};

// Parses `text` (the whole file); `where` names it in messages. Throws
// memtrain::Error "WHERE line L, column 'NAME' (field F): ..." (the header's
// fields by number) on a NUL byte, a quoted field not closed before the end
// of the file or followed by text (L: where the quote opened), and "WHERE
// line L: ..." on a record with more fields than the header, or no header.
// `on_header` (may be empty) sees the header before any row is read, so
// that a wrong column name is refused before a row's field count.
CsvTable parse_csv(
    const std::string& text,
    char sep,
    const std::string& where,
    const std::function<void(const std::vector<std::string>&)>& on_header = {});

// "WHERE line L, column 'NAME' (field F)", NAME = header[index] (index
// 0-based); "WHERE line L, field F" when index is past the header (or the
// header is not read yet: pass {}). The place of every message about a
// field.
std::string csv_position(
    const std::string& where,
    const std::vector<std::string>& header,
    int64_t line,
    size_t index);

}  // namespace memtrain
