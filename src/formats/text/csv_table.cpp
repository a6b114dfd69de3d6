// pandas' default CSV reading, for convert-captions: see csv_table.h.

#include "memtrain/formats/text/csv_table.h"

#include "memtrain/util/error.h"

namespace memtrain {

std::string csv_position(
    const std::string& where,
    const std::vector<std::string>& header,
    int64_t line,
    size_t index) {
  std::string s = where + " line " + std::to_string(line) + ", ";
  if (index < header.size())
    return s + "column '" + header[index] + "' (field " +
           std::to_string(index + 1) + ")";
  return s + "field " + std::to_string(index + 1);
}

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
  // The header is empty while the header record is read.
  auto at = [&](int64_t at_line, size_t index) {
    return csv_position(where, table.header, at_line, index);
  };
  // A NUL byte would end the field where it is used as a C string (an
  // image path cut short opens another image): refused wherever it is.
  auto no_nul = [&](int64_t at_line, size_t index) {
    MT_CHECK(
        text[i] != '\0',
        at(at_line, index),
        ": a NUL byte (\\0); a text CSV holds none (is it UTF-16, or not "
        "text?): remove it, or save the file as UTF-8");
  };
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
      no_nul(line, rec.fields.size());
      if (c == '"' && at_field_start) {  // a quoted field
        const int64_t opened = line;
        ++i;
        for (;;) {
          MT_CHECK(
              i < n,
              at(opened, rec.fields.size()),
              ": a quoted field (\") is not closed before the end of the file; "
              "close it, or double the quotes inside it (\"\")");
          no_nul(line, rec.fields.size());
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
        // pandas goes on unquoted ("a"b -> ab); after an unclosed quote that
        // joins the rows up to the next quote into this field. Refused.
        if (i < n && text[i] != sep && !is_break(i)) {
          if (line != opened)
            throw Error(
                at(opened, rec.fields.size()) +
                ": the quote (\") opened on this line is not closed on it; the "
                "next quote, on line " +
                std::to_string(line) +
                ", would end the field with text after it, joining the rows "
                "between into this field; close the quote (inner quotes "
                "doubled: \"\")");
          throw Error(
              at(opened, rec.fields.size()) +
              ": text after the closing quote (\"...\"x); a field that starts "
              "with \" is quoted up to the next single \": quote the whole "
              "field and double the quotes inside it (\"\"\"a\"\" b\")");
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
