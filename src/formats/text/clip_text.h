#pragma once
// Private to the CLIP tokenizer (clip_tokenizer.cpp, clip_text_clean.cpp):
// text as code points, and the character classes of Python and its regex
// module that the tokenizer reproduces.

#include <string>

namespace memtrain::clip_text {

// UTF-8 to code points; false (and *out unspecified) on invalid UTF-8
// (overlong forms, surrogates, values above U+10FFFF, truncated sequences).
bool decode_utf8(const std::string& in, std::u32string* out);
std::string encode_utf8(const std::u32string& in);

// Python's str.isspace(): bidirectional class WS, B or S, or category Zs.
bool py_isspace(char32_t c);
// \s of the regex module on str patterns: White_Space (py_isspace without
// U+001C..U+001F).
bool regex_space(char32_t c);
// \p{L} (Lu, Ll, Lt, Lm, Lo) and \p{N} (Nd, Nl, No), by ICU.
bool is_letter(char32_t c);
bool is_number(char32_t c);
// \d of Python's re on str patterns: category Nd.
bool is_decimal(char32_t c);

}  // namespace memtrain::clip_text
