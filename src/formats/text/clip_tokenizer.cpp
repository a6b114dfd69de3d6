// open_clip's SimpleTokenizer: vocabulary, pre-tokenizer and BPE. The
// cleaning of captions is in clip_text_clean.cpp.

#include "memtrain/formats/text/clip_tokenizer.h"

#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "formats/text/clip_text.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace fs = std::filesystem;
namespace {

constexpr const char* kStartText = "<start_of_text>";
constexpr const char* kEndText = "<end_of_text>";
// open_clip reads merges[1 : 49152 - 256 - 2 + 1]: the header line skipped.
constexpr size_t kMerges = 49152 - 256 - 2;

std::string read_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");  // plain files read as they are
  MT_CHECK(
      f != nullptr,
      "cannot open the CLIP BPE vocabulary '",
      path,
      "' (pass --bpe FILE: open_clip's bpe_simple_vocab_16e6.txt.gz)");
  std::string out;
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0)
    out.append(buf, static_cast<size_t>(n));
  int err = 0;
  const std::string why = n < 0 ? gzerror(f, &err) : "";
  gzclose(f);
  MT_CHECK(
      n == 0,
      "cannot read the CLIP BPE vocabulary '",
      path,
      "': ",
      why,
      " (a damaged .gz? open_clip ships bpe_simple_vocab_16e6.txt.gz)");
  return out;
}

// The UTF-8 of each code point of `s` (valid UTF-8).
std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

}  // namespace

ClipTokenizer::ClipTokenizer(const std::string& bpe_path) {
  // bytes_to_unicode: the printable bytes map to themselves, the others to
  // U+0100 onwards in byte order; the vocabulary starts in this order.
  std::vector<int> order;
  for (int b = 0; b < 256; ++b)
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)
      order.push_back(b);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable =
        (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const char32_t c = printable ? char32_t(b) : char32_t(256 + extra++);
    byte_unicode_[b] = clip_text::encode_utf8(std::u32string(1, c));
    if (!printable)
      order.push_back(b);
  }

  const std::string text = read_gz(bpe_path);
  std::vector<std::pair<std::string, std::string>> merges;
  std::istringstream lines(text);
  std::string line;
  std::getline(lines, line);  // "#version: 0.2"
  for (size_t i = 0; i < kMerges && std::getline(lines, line); ++i) {
    std::istringstream parts(line);
    std::string first, second, more;
    MT_CHECK(
        (parts >> first >> second) && !(parts >> more),
        "CLIP BPE vocabulary '",
        bpe_path,
        "' line ",
        i + 2,
        ": expected a merge 'A B', found '",
        line,
        "'");
    merges.emplace_back(first, second);
  }
  MT_CHECK(
      merges.size() == kMerges,
      "CLIP BPE vocabulary '",
      bpe_path,
      "': ",
      merges.size(),
      " merges, expected at least ",
      kMerges,
      " (open_clip's bpe_simple_vocab_16e6.txt.gz)");

  // Vocabulary: bytes, bytes + "</w>", merges, special tokens; a later
  // duplicate takes the id, as dict(zip(vocab, range(len(vocab)))).
  int32_t id = 0;
  for (int b : order)
    encoder_[byte_unicode_[b]] = id++;
  for (int b : order)
    encoder_[byte_unicode_[b] + "</w>"] = id++;
  for (size_t r = 0; r < merges.size(); ++r) {
    encoder_[merges[r].first + merges[r].second] = id++;
    ranks_.emplace(merges[r].first + " " + merges[r].second, int32_t(r));
  }
  encoder_[kStartText] = id++;
  encoder_[kEndText] = id++;
  MT_INTERNAL_ASSERT(id == kVocabSize);
  cache_[kStartText] = {kStartToken};
  cache_[kEndText] = {kEndToken};
}

std::string ClipTokenizer::default_bpe_path(std::string* looked_at) {
  std::string tried;
  if (const char* env = std::getenv("MEMTRAIN_CLIP_BPE"); env && *env) {
    if (looked_at)
      *looked_at = std::string("$MEMTRAIN_CLIP_BPE (") + env + ")";
    return env;
  }
  const char* venv = std::getenv("MEMTRAIN_TORCH_VENV");
  const fs::path lib =
      fs::path(venv && *venv ? venv : "/opt/memtrain/torch-venv") / "lib";
  const std::string pattern =
      (lib / "python3.*/site-packages/open_clip/bpe_simple_vocab_16e6.txt.gz")
          .string();
  if (looked_at)
    *looked_at = "$MEMTRAIN_CLIP_BPE (not set), " + pattern;
  std::error_code ec;
  std::vector<fs::path> found;
  for (fs::directory_iterator it(lib, ec), end; !ec && it != end;
       it.increment(ec)) {
    const fs::path p =
        it->path() / "site-packages/open_clip" / "bpe_simple_vocab_16e6.txt.gz";
    if (it->path().filename().string().rfind("python3.", 0) == 0 &&
        fs::is_regular_file(p, ec))
      found.push_back(p);
  }
  std::sort(found.begin(), found.end());
  return found.empty() ? "" : found.back().string();
}

int32_t ClipTokenizer::id_of(const std::string& entry) const {
  const auto it = encoder_.find(entry);
  return it == encoder_.end() ? -1 : it->second;
}

const std::vector<int32_t>& ClipTokenizer::bpe(const std::string& token) {
  if (const auto it = cache_.find(token); it != cache_.end())
    return it->second;
  std::vector<std::string> word = utf8_chars(token);
  word.back() += "</w>";
  // SimpleTokenizer.bpe: merge the adjacent pair of lowest rank (every
  // occurrence, left to right) until no pair has a rank.
  while (word.size() > 1) {
    int32_t best = INT32_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      const auto r = ranks_.find(word[i] + " " + word[i + 1]);
      if (r != ranks_.end() && r->second < best)
        best = r->second, at = i;
    }
    if (best == INT32_MAX)
      break;
    const std::string first = word[at], second = word[at + 1];
    std::vector<std::string> merged;
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(word[i++]);
      }
    }
    word = std::move(merged);
  }
  std::vector<int32_t> ids;
  for (const std::string& s : word) {
    const auto it = encoder_.find(s);
    MT_INTERNAL_ASSERT(it != encoder_.end(), "BPE symbol '", s, "'");
    ids.push_back(it->second);
  }
  if (cache_.size() > (1u << 20)) {  // bounded: a long CSV's rare words
    cache_.clear();
    cache_[kStartText] = {kStartToken};
    cache_[kEndText] = {kEndToken};
  }
  return cache_.emplace(token, std::move(ids)).first->second;
}

std::vector<std::string> clip_pre_tokens(const std::string& cleaned) {
  using namespace clip_text;
  std::u32string t;
  MT_CHECK(decode_utf8(cleaned, &t), "clip_pre_tokens: not valid UTF-8");
  // IGNORECASE: the text is lower case already; of the characters left,
  // only U+017F (long s) folds onto a letter of the literals ('s').
  auto starts = [&](size_t pos, const char32_t* lit) {
    for (size_t k = 0; lit[k]; ++k) {
      if (pos + k >= t.size())
        return false;
      const char32_t c = t[pos + k] == 0x17F ? U's' : t[pos + k];
      if (c != lit[k])
        return false;
    }
    return true;
  };
  static const char32_t* const kLiterals[] = {
      U"<start_of_text>",
      U"<end_of_text>",
      U"'s",
      U"'t",
      U"'re",
      U"'ve",
      U"'m",
      U"'ll",
      U"'d"};
  std::vector<std::string> out;
  for (size_t pos = 0; pos < t.size();) {
    size_t end = pos;
    for (const char32_t* lit : kLiterals) {
      if (starts(pos, lit)) {
        end = pos + std::char_traits<char32_t>::length(lit);
        break;
      }
    }
    if (end == pos) {
      if (is_letter(t[pos])) {
        while (end < t.size() && is_letter(t[end]))
          ++end;
      } else if (is_number(t[pos])) {
        end = pos + 1;
      } else if (!regex_space(t[pos])) {
        while (end < t.size() && !regex_space(t[end]) && !is_letter(t[end]) &&
               !is_number(t[end]))
          ++end;
      } else {
        ++pos;  // whitespace: between matches
        continue;
      }
    }
    out.push_back(encode_utf8(t.substr(pos, end - pos)));
    pos = end;
  }
  return out;
}

std::vector<int32_t> ClipTokenizer::encode(const std::string& text) {
  std::vector<int32_t> ids;
  for (const std::string& token : clip_pre_tokens(clean(text))) {
    std::string mapped;
    for (unsigned char b : token)
      mapped += byte_unicode_[b];
    const std::vector<int32_t>& part = bpe(mapped);
    ids.insert(ids.end(), part.begin(), part.end());
  }
  return ids;
}

std::vector<int32_t> ClipTokenizer::tokenize(
    const std::string& text, int64_t context_length, int64_t* full_length) {
  MT_CHECK(context_length >= 1, "context length ", context_length, " < 1");
  std::vector<int32_t> ids{kStartToken};
  const std::vector<int32_t> body = encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  ids.push_back(kEndToken);
  if (full_length)
    *full_length = static_cast<int64_t>(ids.size());
  if (static_cast<int64_t>(ids.size()) > context_length) {
    ids.resize(static_cast<size_t>(context_length));
    ids.back() = kEndToken;
  }
  ids.resize(static_cast<size_t>(context_length), 0);
  return ids;
}

}  // namespace memtrain
