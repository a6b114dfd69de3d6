#pragma once
// A delimited text file read as pandas.read_csv(path, sep=SEP) reads it with
// its defaults (the C parser), as open_clip's CsvDataset does: the first
// record is the header; quotechar '"' opens a quoted field only at the start
// of a field, a doubled quote inside it is one quote, separators and line
// breaks inside it are kept; after the closing quote the field goes on
// unquoted up to the next separator ("a"b -> ab); a quote inside an
// unquoted field is an ordinary character; records end at \n, \r\n or \r;
// empty lines and lines of only spaces (and tabs, when the separator is
// not a tab) are skipped; a UTF-8 byte order mark at the start is dropped.
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
// memtrain::Error "WHERE line L: ..." on a quoted field not closed before the
// end of the file, a record with more fields than the header, or no header.
// `on_header` (may be empty) sees the header before any row is read, so
// that a wrong column name is refused before a row's field count.
CsvTable parse_csv(
    const std::string& text,
    char sep,
    const std::string& where,
    const std::function<void(const std::vector<std::string>&)>& on_header = {});

}  // namespace memtrain
