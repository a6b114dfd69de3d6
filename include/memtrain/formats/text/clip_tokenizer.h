#pragma once
// CLIP's text tokenizer, as open_clip 3.3.0's `open_clip.tokenize`
// (SimpleTokenizer with clean='lower', the default): the byte-level BPE of
// bpe_simple_vocab_16e6.txt.gz read at run time, start token 49406, end
// token 49407, zero padding, truncation that keeps the end token last. Used
// by `memtrain convert-captions` (caption_convert.h). No LibTorch; zlib reads
// the vocabulary, ICU gives Unicode's normalisation, lowercasing and general
// categories.
//
// Cleaning (open_clip's _clean_lower): ftfy.fix_text, html.unescape twice,
// strip, whitespace collapsed to one space, lower(). Of ftfy 6.3.1's
// fix_text (default configuration) these steps are reproduced exactly, in
// its order, per line, repeated until the line no longer changes:
//   unescape_html (only while no line so far contained '<', as ftfy's
//   "auto"), fix_c1_controls, fix_latin_ligatures, fix_character_width,
//   uncurl_quotes, fix_line_breaks, remove_terminal_escapes,
//   remove_control_chars, NFC normalisation.
// Not reproduced: fix_encoding (ftfy's heuristic mojibake repair, with its
// restore_byte_a0, replace_lossy_sequences and decode_inconsistent_utf8;
// "sÃ³" stays "sÃ³" here, ftfy makes it "só"), and fix_surrogates (UTF-8
// input has no surrogates). html.unescape is Python's, with the HTML5
// named references (html_entities.inc, generated from Python by
// src/formats/text/html_entities_gen.py) and numeric references as Python
// decodes them. Unicode data is ICU's (Unicode 15 for ICU 72) where Python 3.11
// (lower(), NFC: Unicode 14) and the regex module (\p{L}, \p{N}) use their
// own: characters assigned after Unicode 14 may be classed differently.

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace memtrain {

class ClipTokenizer {
 public:
  static constexpr int32_t kStartToken = 49406;  // <start_of_text>
  static constexpr int32_t kEndToken = 49407;    // <end_of_text>
  static constexpr int32_t kVocabSize = 49408;
  static constexpr int64_t kContextLength = 77;  // open_clip's default

  // Reads the vocabulary and merges (open_clip's bpe_simple_vocab_16e6.txt.gz,
  // gzip-compressed or plain). Throws memtrain::Error naming the file when
  // it cannot be read or has fewer than 48894 merges.
  explicit ClipTokenizer(const std::string& bpe_path);

  // The BPE file to use when --bpe is not given: $MEMTRAIN_CLIP_BPE, else
  // open_clip's own copy in the torch venv ($MEMTRAIN_TORCH_VENV, default
  // /opt/memtrain/torch-venv, lib/python3.*/site-packages/open_clip/);
  // "" when neither exists. *looked_at lists what was tried.
  static std::string default_bpe_path(std::string* looked_at = nullptr);

  // open_clip's _clean_lower(text) (see above), UTF-8 in and out. Throws
  // memtrain::Error when `text` is not valid UTF-8.
  static std::string clean(const std::string& text);

  // SimpleTokenizer.encode: the BPE ids of clean(text), without the start
  // and end tokens. Not thread-safe (a cache of words seen).
  std::vector<int32_t> encode(const std::string& text);

  // open_clip.tokenize([text], context_length)[0]: start, encode(text),
  // end; longer than context_length: cut to it, the last id made the end
  // token; shorter: zero padded. *full_length (may be null) gets the
  // length before the cut (ids with start and end).
  std::vector<int32_t> tokenize(
      const std::string& text,
      int64_t context_length = kContextLength,
      int64_t* full_length = nullptr);

  // The id of a vocabulary entry (in the file's byte-to-unicode spelling,
  // "a</w>"), -1 if none: for tests.
  int32_t id_of(const std::string& entry) const;

 private:
  // The BPE of one pre-token, its bytes mapped by bytes_to_unicode.
  const std::vector<int32_t>& bpe(const std::string& token);

  std::unordered_map<std::string, int32_t> encoder_;
  std::unordered_map<std::string, int32_t> ranks_;  // "first second" -> rank
  std::unordered_map<std::string, std::vector<int32_t>> cache_;
  std::string byte_unicode_[256];  // bytes_to_unicode, as UTF-8
};

// open_clip's pre-tokenizer on cleaned text: the matches of
// <start_of_text>|<end_of_text>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|
// [^\s\p{L}\p{N}]+ (IGNORECASE), as UTF-8 strings. For tests.
std::vector<std::string> clip_pre_tokens(const std::string& cleaned);

}  // namespace memtrain
