// pandas' default CSV reading, for convert-captions: see csv_table.h.

#include "memtrain/formats/text/csv_table.h"

#include "memtrain/util/error.h"

namespace memtrain {

CsvTable parse_csv(
    const std::string& text,
    char sep,
    const std::string& where,
    const std::function<void(const std::vector<std::string>&)>& on_header) {
  CsvTable table;
  size_t i = 0;
  const size_t n = text.size();
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0)
    i = 3;
  int64_t line = 1;
  // Consumes one line break at i (\r\n, \r or \n), counting it.
  auto eat_break = [&]() {
    if (text[i] == '\r' && i + 1 < n && text[i + 1] == '\n')
      ++i;
    ++i;
    ++line;
  };
  auto is_break = [&](size_t k) { return text[k] == '\n' || text[k] == '\r'; };
  bool have_header = false;
  while (i < n) {
    // A blank line (or one of only spaces, tabs too when they do not
    // separate) is skipped, as pandas' skip_blank_lines.
    size_t k = i;
    while (k < n && (text[k] == ' ' || (text[k] == '\t' && sep != '\t')))
      ++k;
    if (k == n || is_break(k)) {
      i = k;
      if (i < n)
        eat_break();
      continue;
    }
    CsvRecord rec;
    rec.line = line;
    std::string field;
    bool at_field_start = true;
    for (;;) {
      if (i == n || is_break(i)) {  // end of record
        rec.fields.push_back(std::move(field));
        if (i < n)
          eat_break();
        break;
      }
      const char c = text[i];
      if (c == sep) {
        rec.fields.push_back(std::move(field));
        field.clear();
        at_field_start = true;
        ++i;
        continue;
      }
      if (c == '"' && at_field_start) {  // a quoted field
        const int64_t opened = line;
        ++i;
        for (;;) {
          MT_CHECK(
              i < n,
              where,
              " line ",
              opened,
              ": a quoted field (\") is not closed before the end of the file; "
              "close it, or double the quotes inside it (\"\")");
          if (text[i] == '"') {
            if (i + 1 < n && text[i + 1] == '"') {
              field += '"';
              i += 2;
              continue;
            }
            ++i;  // the closing quote
            break;
          }
          if (text[i] == '\n' || text[i] == '\r') {
            // Kept as written; \r\n counts as one line.
            if (text[i] == '\r' && i + 1 < n && text[i + 1] == '\n')
              field += text[i++];
            field += text[i++];
            ++line;
            continue;
          }
          field += text[i++];
        }
        at_field_start = false;
        continue;
      }
      field += c;
      at_field_start = false;
      ++i;
    }
    if (!have_header) {
      table.header = std::move(rec.fields);
      have_header = true;
      if (on_header)
        on_header(table.header);
      continue;
    }
    MT_CHECK(
        rec.fields.size() <= table.header.size(),
        where,
        " line ",
        rec.line,
        ": ",
        rec.fields.size(),
        " fields, the header has ",
        table.header.size(),
        " (is the separator right? a field that holds the separator must be "
        "quoted: \"...\")");
    table.rows.push_back(std::move(rec));
  }
  MT_CHECK(have_header, where, ": no header row (the file is empty)");
  return table;
}

}  // namespace memtrain
