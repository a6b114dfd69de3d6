// make-data --kind captions: a pair file of N random RGB images and N
// random token rows shaped like CLIP's (docs/data-format.md, Pairs), for
// measuring model.name: clip's memory and time (bench_memory --models
// clip), not for learning: an image's pixels do not depend on its tokens,
// so there is nothing to match. Row i's tokens are 49406 (<start_of_text>),
// n ids drawn uniformly from [0, 49406) with n uniform in 1..75, 49407
// (<end_of_text>), then zeros up to 77 -- what convert-captions writes for a
// caption of n BPE tokens. Pixels are uniform bytes. Both come from --seed
// and --split, from two streams of their own.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "data/h5/h5_util.h"
#include "data/h5/layout.h"
#include "data/synthetic/synthetic_util.h"
#include "memtrain/data/synthetic/synthetic.h"
#include "memtrain/formats/text/clip_tokenizer.h"
#include "memtrain/util/error.h"

namespace memtrain::synthetic {

void make_captions(const SyntheticSpec& spec, const std::string& path) {
  MT_CHECK(
      spec.channels == 3,
      "make-data --kind captions: images are RGB, --channels must be 3 (not ",
      spec.channels,
      ")");
  const int64_t n = spec.samples;
  const int64_t length = ClipTokenizer::kContextLength;
  const int64_t plane = 3 * spec.height * spec.width;
  // Row at a time, in blocks: memory stays at one block of images, however
  // large N is.
  const int64_t block = std::max<int64_t>(1, (int64_t{64} << 20) / plane);
  // Separate streams: the pixels are the same whatever the tokens are.
  Gaussian token_gen(spec.seed, hash_name(spec.split));
  Gaussian pixel_gen(spec.seed, hash_name(spec.split) ^ 0x1a6e5u);
  write_file(path, [&](hid_t f) {
    const hsize_t h = static_cast<hsize_t>(spec.height);
    const hsize_t w = static_cast<hsize_t>(spec.width);
    const hsize_t l = static_cast<hsize_t>(length);
    // One image a chunk and rows of tokens in about 1 MiB, as
    // convert-captions writes them.
    h5::Handle images = h5::create_dataset(
        f, layout::kImages, H5T_STD_U8LE, {0, 3, h, w}, {1, 3, h, w}, true);
    h5::Handle tokens = h5::create_dataset(
        f,
        layout::kTokens,
        H5T_STD_I32LE,
        {0, l},
        {std::min<hsize_t>(static_cast<hsize_t>(n), (1u << 20) / (4 * l)), l},
        true);
    std::vector<uint8_t> pixels;
    std::vector<int32_t> ids;
    for (int64_t first = 0; first < n; first += block) {
      const int64_t rows = std::min(block, n - first);
      pixels.resize(static_cast<size_t>(rows * plane));
      for (size_t i = 0; i < pixels.size(); i += 8) {
        uint64_t bits = pixel_gen.raw();
        for (size_t b = i; b < std::min(i + 8, pixels.size()); ++b) {
          pixels[b] = static_cast<uint8_t>(bits & 0xffu);
          bits >>= 8;
        }
      }
      ids.assign(static_cast<size_t>(rows * length), 0);
      for (int64_t r = 0; r < rows; ++r) {
        int32_t* row = ids.data() + r * length;
        const int64_t words =
            1 + static_cast<int64_t>(token_gen.raw() % (length - 2));
        row[0] = ClipTokenizer::kStartToken;
        for (int64_t k = 1; k <= words; ++k)
          row[k] = static_cast<int32_t>(
              token_gen.raw() % ClipTokenizer::kStartToken);
        row[words + 1] = ClipTokenizer::kEndToken;
      }
      h5::append_rows(
          images.get(),
          H5T_NATIVE_UINT8,
          static_cast<hsize_t>(rows),
          pixels.data());
      h5::append_rows(
          tokens.get(),
          H5T_NATIVE_INT32,
          static_cast<hsize_t>(rows),
          ids.data());
    }
    // uint8 in [0, 255] -> [0, 1], as convert-captions writes.
    h5::write_attr(images.get(), layout::kScale, 1.0 / 255.0);
    h5::write_attr(images.get(), layout::kShift, 0.0);
    h5::write_attr(
        tokens.get(), layout::kVocabSize, int64_t{ClipTokenizer::kVocabSize});
    h5::write_attr(
        tokens.get(), layout::kStartToken, int64_t{ClipTokenizer::kStartToken});
    h5::write_attr(
        tokens.get(), layout::kEndToken, int64_t{ClipTokenizer::kEndToken});
    h5::write_attr(tokens.get(), layout::kPadToken, int64_t{0});
    h5::write_attr(f, layout::kLayoutVersion, layout::kVersion);
    h5::write_attr(f, layout::kKind, std::string("pairs"));
    h5::write_attr(f, layout::kVocabSize, int64_t{ClipTokenizer::kVocabSize});
    h5::write_attr(f, layout::kContextLength, length);
    h5::write_attr(
        f, layout::kGenerator, std::string("memtrain make-data captions"));
    h5::write_attr(f, layout::kSeed, static_cast<int64_t>(spec.seed));
    h5::write_attr(f, layout::kSplit, spec.split);
  });
}

}  // namespace memtrain::synthetic
