// The CLIP tokenizer (formats/text/clip_tokenizer.h) against ids and cleaned
// text taken from open_clip 3.3.0 (open_clip.tokenize and
// open_clip.tokenizer._clean_lower in the torch venv). The tokenizer tests need
// open_clip's bpe_simple_vocab_16e6.txt.gz (ClipTokenizer::default_bpe_path)
// and are skipped, saying so, without it.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "memtrain/formats/text/clip_tokenizer.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

std::unique_ptr<ClipTokenizer> tokenizer_or_skip() {
  const std::string bpe = ClipTokenizer::default_bpe_path();
  if (bpe.empty())
    return nullptr;
  return std::make_unique<ClipTokenizer>(bpe);
}

#define TOKENIZER_OR_SKIP(name)                                             \
  auto name = tokenizer_or_skip();                                          \
  if (!name)                                                                \
  GTEST_SKIP() << "no bpe_simple_vocab_16e6.txt.gz: set MEMTRAIN_CLIP_BPE " \
                  "or run launch/install_peers.sh (open_clip)"

// open_clip.tokenize([text])[0] without its zero padding.
std::vector<int32_t> ids(ClipTokenizer& t, const std::string& text) {
  std::vector<int32_t> out = t.tokenize(text);
  EXPECT_EQ(out.size(), 77u);
  while (!out.empty() && out.back() == 0)
    out.pop_back();
  return out;
}

TEST(ClipTokenizer, VocabularyLayout) {
  TOKENIZER_OR_SKIP(t);
  // bytes_to_unicode order: '!' is the first byte, "a</w>" = 256 + 'a' - '!'.
  EXPECT_EQ(t->id_of("!"), 0);
  EXPECT_EQ(t->id_of("a</w>"), 256 + 'a' - '!');
  EXPECT_EQ(t->id_of("<start_of_text>"), ClipTokenizer::kStartToken);
  EXPECT_EQ(t->id_of("<end_of_text>"), ClipTokenizer::kEndToken);
  EXPECT_EQ(t->id_of("cat</w>"), 2368);
}

TEST(ClipTokenizer, IdsAsOpenClip) {
  TOKENIZER_OR_SKIP(t);
  using V = std::vector<int32_t>;
  EXPECT_EQ(
      ids(*t, "a photo of a cat"),
      (V{49406, 320, 1125, 539, 320, 2368, 49407}));
  EXPECT_EQ(
      ids(*t, "Ça coûte 5€ — naïve café"),
      (V{49406,
         22711,
         622,
         127,
         119,
         756,
         276,
         6309,
         2005,
         1097,
         35689,
         563,
         15304,
         49407}));
  // Contractions and curly quotes (uncurl_quotes).
  EXPECT_EQ(
      ids(*t, "I'll say it's \u201cfine\u201d"),
      (V{49406, 328, 1342, 1451, 585, 568, 257, 3797, 257, 49407}));
  // A ligature, full-width letters and the ideographic space.
  EXPECT_EQ(
      ids(*t,
          "\uFB01ne \uFF26\uFF35\uFF2C\uFF2C\u3000\uFF57\uFF49\uFF44\uFF54"
          "\uFF48"),
      (V{49406, 3797, 1476, 23571, 49407}));
  // ftfy's and html's unescaping (&amp;amp; twice), ftfy's upper-case names.
  EXPECT_EQ(
      ids(*t, "Tom &amp;amp; Jerry &lt;3 &NTILDE;"),
      (V{49406, 2435, 261, 9164, 283, 274, 127, 365, 49407}));
  // lower() with the final sigma.
  EXPECT_EQ(
      ids(*t, "Ελληνικά ΟΔΟΣ"),
      (V{49406, 138, 113, 138, 119, 138, 119, 138, 115, 138, 121, 138, 117,
         138,   118, 138, 361, 138, 123, 138, 112, 138, 123, 139, 480, 49407}));
  EXPECT_EQ(
      ids(*t, "😀 東京 ½"), (V{49406, 7334, 48338, 21078, 361, 33613, 49407}));
  EXPECT_EQ(ids(*t, "Wow!!! ...??"), (V{49406, 2781, 995, 3002, 2197, 49407}));
  EXPECT_EQ(ids(*t, ""), (V{49406, 49407}));
}

TEST(ClipTokenizer, TruncationKeepsTheEndToken) {
  TOKENIZER_OR_SKIP(t);
  std::string text;
  for (int i = 0; i < 100; ++i)
    text += "word ";
  int64_t full = 0;
  // open_clip.tokenize([text], context_length=10)[0].
  EXPECT_EQ(
      t->tokenize(text, 10, &full),
      (std::vector<int32_t>{
          49406, 2653, 2653, 2653, 2653, 2653, 2653, 2653, 2653, 49407}));
  EXPECT_EQ(full, 102);
  const std::vector<int32_t> padded = t->tokenize("word", 6, &full);
  EXPECT_EQ(padded, (std::vector<int32_t>{49406, 2653, 49407, 0, 0, 0}));
  EXPECT_EQ(full, 3);
}

TEST(ClipTokenizer, CleanAsOpenClip) {
  // open_clip.tokenizer._clean_lower(text).
  EXPECT_EQ(ClipTokenizer::clean("  Tom &amp;amp;\n\tJerry  "), "tom & jerry");
  EXPECT_EQ(
      ClipTokenizer::clean("I'll say it's \u201cfine\u201d"),
      "i'll say it's \"fine\"");
  // '<' in the text: ftfy leaves entities alone, html.unescape does not,
  // so the curly quote stays curly.
  EXPECT_EQ(ClipTokenizer::clean("<b> &rsquo;"), "<b> \u2019");
  EXPECT_EQ(ClipTokenizer::clean("&rsquo;"), "'");
  EXPECT_EQ(ClipTokenizer::clean("e\u0301cole"), "\u00e9cole");  // NFC
  EXPECT_EQ(ClipTokenizer::clean("a\u0085b\x01"), "a\u2026b");   // C1, control
  EXPECT_EQ(ClipTokenizer::clean("\u0130"), "i\u0307");  // full lowercase
  EXPECT_THROW(ClipTokenizer::clean("\xff"), Error);
}

TEST(ClipTokenizer, PreTokensAsOpenClipsPattern) {
  // regex.findall(open_clip's pattern, text).
  using S = std::vector<std::string>;
  EXPECT_EQ(
      clip_pre_tokens("don't it's we're 12ab ...!! <start_of_text>x"),
      (S{"don",
         "'t",
         "it",
         "'s",
         "we",
         "'re",
         "1",
         "2",
         "ab",
         "...!!",
         "<start_of_text>",
         "x"}));
  // A combining mark is neither \p{L} nor \p{N}.
  EXPECT_EQ(clip_pre_tokens("i\u0307x"), (S{"i", "\u0307", "x"}));
}

}  // namespace
}  // namespace memtrain
