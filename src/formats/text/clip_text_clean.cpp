// open_clip's caption cleaning (clean='lower'): the reproduced part of
// ftfy.fix_text, Python's html.unescape twice, strip, whitespace collapsed,
// lower(). What is and is not reproduced: include/memtrain/formats/
// text/clip_tokenizer.h. Unicode data from ICU.

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "formats/text/clip_text.h"
#include "memtrain/formats/text/clip_tokenizer.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace clip_text {

bool decode_utf8(const std::string& in, std::u32string* out) {
  out->clear();
  out->reserve(in.size());
  const auto* s = reinterpret_cast<const unsigned char*>(in.data());
  const size_t n = in.size();
  for (size_t i = 0; i < n;) {
    const unsigned char b = s[i];
    int len = 0;
    char32_t c = 0, min = 0;
    if (b < 0x80) {
      out->push_back(b);
      ++i;
      continue;
    } else if ((b & 0xE0) == 0xC0) {
      len = 2, c = b & 0x1F, min = 0x80;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3, c = b & 0x0F, min = 0x800;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4, c = b & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (i + len > n)
      return false;
    for (int k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80)
        return false;
      c = (c << 6) | (s[i + k] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
      return false;
    out->push_back(c);
    i += len;
  }
  return true;
}

std::string encode_utf8(const std::u32string& in) {
  std::string out;
  out.reserve(in.size());
  for (char32_t c : in) {
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xC0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xE0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  return out;
}

bool py_isspace(char32_t c) {
  if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20))
    return true;
  switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool regex_space(char32_t c) {
  return py_isspace(c) && !(c >= 0x1C && c <= 0x1F);
}

bool is_letter(char32_t c) {
  return (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_L_MASK) != 0;
}

bool is_number(char32_t c) {
  return (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_N_MASK) != 0;
}

bool is_decimal(char32_t c) {
  return u_charType(static_cast<UChar32>(c)) == U_DECIMAL_DIGIT_NUMBER;
}

}  // namespace clip_text

namespace {
using clip_text::decode_utf8;
using clip_text::encode_utf8;
using clip_text::py_isspace;

struct NamedEntity {
  const char* name;  // without '&'
  const char* value;
};
struct NumericEntity {
  uint32_t number;
  const char* value;
};
#include "formats/text/html_entities.inc"

template <size_t N>
const char* find_entity(const NamedEntity (&table)[N], const std::string& n) {
  const auto* end = table + N;
  const auto* it = std::lower_bound(
      table, end, n, [](const NamedEntity& e, const std::string& key) {
        return std::strcmp(e.name, key.c_str()) < 0;
      });
  return it != end && n == it->name ? it->value : nullptr;
}

std::u32string u32(const char* utf8) {
  std::u32string out;
  decode_utf8(utf8, &out);
  return out;
}

bool ascii_digit(char32_t c) {
  return c >= '0' && c <= '9';
}
bool ascii_hex(char32_t c) {
  return ascii_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
bool ascii_alnum(char32_t c) {
  return ascii_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// html._replace_charref for a number (saturated above U+10FFFF).
std::u32string numeric_charref(uint64_t num) {
  for (const NumericEntity& e : kInvalidCharrefs)
    if (e.number == num)
      return u32(e.value);
  if ((num >= 0xD800 && num <= 0xDFFF) || num > 0x10FFFF)
    return U"\uFFFD";
  if (std::binary_search(
          std::begin(kInvalidCodepoints), std::end(kInvalidCodepoints), num))
    return U"";
  return std::u32string(1, static_cast<char32_t>(num));
}

// html._replace_charref for a name (with its ';' if it had one): the name,
// else its longest prefix of 2 or more characters that is one (the rest
// kept), else unchanged.
std::u32string named_charref(const std::u32string& name) {
  if (const char* v = find_entity(kHtml5Entities, encode_utf8(name)))
    return u32(v);
  for (size_t x = name.size() - 1; x >= 2 && x < name.size(); --x) {
    const char* v = find_entity(kHtml5Entities, encode_utf8(name.substr(0, x)));
    if (v != nullptr)
      return u32(v) + name.substr(x);
  }
  return U"&" + name;
}

// Python's html.unescape: the matches of
// &(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?) replaced.
std::u32string html_unescape(const std::u32string& s) {
  if (s.find(U'&') == std::u32string::npos)
    return s;
  std::u32string out;
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    if (s[i] != U'&') {
      out += s[i++];
      continue;
    }
    size_t k = i + 1;
    if (k < n && s[k] == U'#') {
      ++k;
      const bool hex =
          k + 1 < n && (s[k] == U'x' || s[k] == U'X') && ascii_hex(s[k + 1]);
      if (!hex && !(k < n && ascii_digit(s[k]))) {
        out += s[i++];  // no match at this '&'
        continue;
      }
      if (hex)
        ++k;
      uint64_t num = 0;
      for (; k < n && (hex ? ascii_hex(s[k]) : ascii_digit(s[k])); ++k) {
        const char32_t c = s[k];
        const uint64_t d = ascii_digit(c) ? c - U'0' : (c | 0x20) - U'a' + 10;
        num = std::min<uint64_t>(num * (hex ? 16 : 10) + d, 0x110000);
      }
      if (k < n && s[k] == U';')
        ++k;
      out += numeric_charref(num);
      i = k;
      continue;
    }
    const size_t start = k;
    while (k < n && k - start < 32 && s[k] != U'\t' && s[k] != U'\n' &&
           s[k] != U'\f' && s[k] != U' ' && s[k] != U'<' && s[k] != U'&' &&
           s[k] != U'#' && s[k] != U';')
      ++k;
    if (k == start) {
      out += s[i++];
      continue;
    }
    if (k < n && s[k] == U';')
      ++k;
    out += named_charref(s.substr(start, k - start));
    i = k;
  }
  return out;
}

// ftfy.fixes.unescape_html: the matches of &#?[0-9A-Za-z]{1,24}; that are
// HTML5 names with ';' (or ftfy's upper-case ones), or numeric references
// that html.unescape decodes whole.
std::u32string ftfy_unescape_html(const std::u32string& s) {
  std::u32string out;
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;
    const bool hash = s[i] == U'&' && j < n && s[j] == U'#';
    if (hash)
      ++j;
    size_t k = j;
    while (s[i] == U'&' && k < n && k - j < 24 && ascii_alnum(s[k]))
      ++k;
    if (s[i] != U'&' || k == j || k >= n || s[k] != U';') {
      out += s[i++];
      continue;
    }
    const std::u32string entity = s.substr(i, k + 1 - i);
    const std::string name = encode_utf8(entity.substr(1));
    const char* v = hash ? nullptr : find_entity(kHtml5Entities, name);
    if (v == nullptr && !hash)
      v = find_entity(kFtfyUpperEntities, name);
    if (v != nullptr) {
      out += u32(v);
    } else if (hash) {
      const std::u32string r = html_unescape(entity);
      out += r.find(U';') == std::u32string::npos ? r : entity;
    } else {
      out += entity;
    }
    i = k + 1;
  }
  return out;
}

icu::UnicodeString to_icu(const std::u32string& s) {
  return icu::UnicodeString::fromUTF32(
      reinterpret_cast<const UChar32*>(s.data()),
      static_cast<int32_t>(s.size()));
}

std::u32string from_icu(const icu::UnicodeString& s) {
  std::string utf8;
  s.toUTF8String(utf8);
  std::u32string out;
  decode_utf8(utf8, &out);
  return out;
}

std::u32string normalize(const std::u32string& s, bool nfkc) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* norm = nfkc
                                     ? icu::Normalizer2::getNFKCInstance(status)
                                     : icu::Normalizer2::getNFCInstance(status);
  MT_CHECK(U_SUCCESS(status), "ICU: no NFC/NFKC data: ", u_errorName(status));
  const icu::UnicodeString out = norm->normalize(to_icu(s), status);
  MT_CHECK(U_SUCCESS(status), "ICU: normalization: ", u_errorName(status));
  return from_icu(out);
}

// The characters ftfy's fix_* steps replace one by one.
bool translate_char(char32_t c, std::u32string* out) {
  if (c >= 0x80 && c <= 0x9F) {  // fix_c1_controls: Windows-1252
    *out = numeric_charref(c);
    return true;
  }
  switch (c) {  // fix_latin_ligatures (chardata.LIGATURES)
    case U'\u0132':
      *out = U"IJ";
      return true;
    case U'\u0133':
      *out = U"ij";
      return true;
    case U'\u0149':
      *out = U"\u02BCn";
      return true;
    case U'\u01F1':
      *out = U"DZ";
      return true;
    case U'\u01F2':
      *out = U"Dz";
      return true;
    case U'\u01F3':
      *out = U"dz";
      return true;
    case U'\u01C4':
      *out = U"D\u017D";
      return true;
    case U'\u01C5':
      *out = U"D\u017E";
      return true;
    case U'\u01C6':
      *out = U"d\u017E";
      return true;
    case U'\u01C7':
      *out = U"LJ";
      return true;
    case U'\u01C8':
      *out = U"Lj";
      return true;
    case U'\u01C9':
      *out = U"lj";
      return true;
    case U'\u01CA':
      *out = U"NJ";
      return true;
    case U'\u01CB':
      *out = U"Nj";
      return true;
    case U'\u01CC':
      *out = U"nj";
      return true;
    case U'\uFB00':
      *out = U"ff";
      return true;
    case U'\uFB01':
      *out = U"fi";
      return true;
    case U'\uFB02':
      *out = U"fl";
      return true;
    case U'\uFB03':
      *out = U"ffi";
      return true;
    case U'\uFB04':
      *out = U"ffl";
      return true;
    case U'\uFB05':
      *out = U"\u017Ft";
      return true;
    case U'\uFB06':
      *out = U"st";
      return true;
    default:
      break;
  }
  return false;
}

// One pass of ftfy's fixers over a segment (fix_and_explain's loop body),
// fix_encoding left out.
std::u32string fix_once(std::u32string t, bool unescape) {
  if (unescape)
    t = ftfy_unescape_html(t);
  std::u32string r, rep;
  // fix_c1_controls, fix_latin_ligatures: one character at a time, in
  // ftfy's order (a C1 character's replacement is never a ligature).
  for (char32_t c : t)
    r += translate_char(c, &rep) ? rep : std::u32string(1, c);
  // fix_character_width: U+3000 and the half/full-width forms FF01..FFEF
  // whose NFKC differs.
  t.clear();
  for (char32_t c : r) {
    if (c == 0x3000) {
      t += U' ';
    } else if (c >= 0xFF01 && c < 0xFFF0) {
      t += normalize(std::u32string(1, c), true);
    } else {
      t += c;
    }
  }
  // uncurl_quotes.
  for (char32_t& c : t) {
    if (c == 0x02BC || (c >= 0x2018 && c <= 0x201B))
      c = U'\'';
    else if (c >= 0x201C && c <= 0x201F)
      c = U'"';
  }
  // fix_line_breaks: \r\n, \r, U+2028, U+2029, U+0085 to \n.
  r.clear();
  for (size_t i = 0; i < t.size(); ++i) {
    const char32_t c = t[i];
    if (c == U'\r' && i + 1 < t.size() && t[i + 1] == U'\n')
      continue;  // the \n follows
    const bool brk = c == U'\r' || c == 0x2028 || c == 0x2029 || c == 0x85;
    r += brk ? U'\n' : c;
  }
  // remove_terminal_escapes: \033\[(\d|;)*[a-zA-Z].
  t.clear();
  for (size_t i = 0; i < r.size(); ++i) {
    if (r[i] == 0x1B && i + 1 < r.size() && r[i + 1] == U'[') {
      size_t k = i + 2;
      while (k < r.size() && (clip_text::is_decimal(r[k]) || r[k] == U';'))
        ++k;
      if (k < r.size() && ((r[k] | 0x20) >= U'a' && (r[k] | 0x20) <= U'z') &&
          r[k] < 0x80) {
        i = k;
        continue;
      }
    }
    t += r[i];
  }
  // remove_control_chars.
  r.clear();
  for (char32_t c : t) {
    const bool control = c <= 0x08 || c == 0x0B || (c >= 0x0E && c <= 0x1F) ||
                         c == 0x7F || (c >= 0x206A && c <= 0x206F) ||
                         c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFC);
    if (!control)
      r += c;
  }
  return normalize(r, false);
}

// ftfy.fix_text with its default configuration, fix_encoding left out:
// line by line ("\n" ends a segment), each fixed until it stays the same;
// HTML entities are decoded only until a segment contains '<'.
std::u32string ftfy_fix_text(const std::u32string& text) {
  constexpr size_t kMaxDecodeLength = 1000000;  // ftfy's max_decode_length
  std::u32string out;
  bool unescape = true;
  for (size_t pos = 0; pos < text.size();) {
    size_t brk = text.find(U'\n', pos);
    brk = brk == std::u32string::npos ? text.size() : brk + 1;
    brk = std::min(brk, pos + kMaxDecodeLength);
    std::u32string seg = text.substr(pos, brk - pos);
    if (unescape && seg.find(U'<') != std::u32string::npos)
      unescape = false;
    for (;;) {
      std::u32string fixed = fix_once(seg, unescape);
      if (fixed == seg)
        break;
      seg = std::move(fixed);
    }
    out += seg;
    pos = brk;
  }
  return out;
}

}  // namespace

std::string ClipTokenizer::clean(const std::string& text) {
  std::u32string t;
  MT_CHECK(
      decode_utf8(text, &t),
      "caption is not valid UTF-8; convert the CSV to UTF-8 (e.g. iconv -f "
      "LATIN1 -t UTF-8)");
  t = html_unescape(html_unescape(ftfy_fix_text(t)));
  // strip(), then " ".join(text.split()) (which strips too).
  std::u32string words;
  for (size_t i = 0; i < t.size();) {
    while (i < t.size() && py_isspace(t[i]))
      ++i;
    size_t j = i;
    while (j < t.size() && !py_isspace(t[j]))
      ++j;
    if (j > i)
      words += (words.empty() ? U"" : U" ") + t.substr(i, j - i);
    i = j;
  }
  // lower(): full lowercase mapping with the final sigma, as Python's.
  icu::UnicodeString lowered = to_icu(words);
  lowered.toLower(icu::Locale::getRoot());
  std::string out;
  lowered.toUTF8String(out);
  return out;
}

}  // namespace memtrain
