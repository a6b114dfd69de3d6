// memtrain convert-captions: a CSV of image paths and captions to a pair
// file of /images, /tokens, /pair_ids (and /captions).

#include "memtrain/convert/caption_convert.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <unordered_map>

#include "convert/caption_csv.h"
#include "data/h5/h5_util.h"
#include "data/h5/layout.h"
#include "memtrain/formats/images/image_decode.h"
#include "memtrain/formats/text/clip_tokenizer.h"
#include "memtrain/util/counter_rng.h"
#include "memtrain/util/error.h"
#include "memtrain/util/file_kind.h"
#include "memtrain/util/temp_path.h"
#include "util/temp_files.h"

namespace memtrain {
namespace fs = std::filesystem;
namespace {

constexpr const char* kCmd = "convert-captions";

struct Row {
  int64_t line;
  std::string path, caption;
  int64_t image;  // index into the distinct images
};

struct Image {
  std::string spelling;  // the CSV's path, normalised: the split's name
  fs::path file;         // where it is read from
  int64_t rows_left = 0;
  bool val = false;
  std::string broken;  // why it cannot be used ("" if not known broken)
  std::vector<uint8_t> pixels;  // kept while rows_left > 1
};

// One output file while it is written: a temporary file beside `path`.
struct Output {
  std::string path, split, tmp;
  h5::Handle file, images, tokens;
  std::vector<uint8_t> pixel_rows;
  std::vector<int32_t> token_rows;
  std::vector<int64_t> pair_ids;
  std::vector<std::string> captions;
  std::unordered_map<int64_t, int64_t> local_id;  // image -> pair id
};

std::string read_image(const fs::path& p, std::string* why) {
  const std::string kind = not_a_regular_file(p.string());
  if (!kind.empty()) {
    *why = kind;
    return "";
  }
  std::ifstream in(p, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (!in.good() && !in.eof())
    *why = std::string("cannot read: ") + std::strerror(errno);
  return bytes.str();
}

// The first 40 characters of a caption (whole UTF-8 sequences), quoted.
std::string caption_start(const std::string& caption) {
  size_t end = 0, chars = 0;
  while (end < caption.size() && chars < 40) {
    ++end;
    while (end < caption.size() && (caption[end] & 0xC0) == 0x80)
      ++end;
    ++chars;
  }
  std::string s = caption.substr(0, end);
  for (char& c : s)
    if (c == '\n' || c == '\r' || c == '\t')
      c = ' ';
  return "'" + s + (end < caption.size() ? "...'" : "'");
}

void open_output(Output* o, const CaptionConvertSpec& spec, TempFiles* temps) {
  remove_stale_temp_files(o->path);
  o->tmp = temp_path_for(o->path);
  temps->paths.push_back(o->tmp);
  o->file = h5::create_file(o->tmp, kCmd);
  const hsize_t s = static_cast<hsize_t>(spec.size);
  const hsize_t l = static_cast<hsize_t>(spec.context_length);
  // One sample a chunk (docs/data-format.md): a random read touches one chunk.
  o->images = h5::create_dataset(
      o->file.get(),
      layout::kImages,
      H5T_STD_U8LE,
      {0, 3, s, s},
      {1, 3, s, s},
      true);
  o->tokens = h5::create_dataset(
      o->file.get(),
      layout::kTokens,
      H5T_STD_I32LE,
      {0, l},
      {std::max<hsize_t>(1, (1u << 20) / (4 * l)), l},
      true);
}

void flush(Output* o, int64_t size, int64_t length) {
  const size_t sample = static_cast<size_t>(3 * size * size);
  if (o->pixel_rows.empty())
    return;
  h5::append_rows(
      o->images.get(),
      H5T_NATIVE_UINT8,
      o->pixel_rows.size() / sample,
      o->pixel_rows.data());
  h5::append_rows(
      o->tokens.get(),
      H5T_NATIVE_INT32,
      o->token_rows.size() / static_cast<size_t>(length),
      o->token_rows.data());
  o->pixel_rows.clear();
  o->token_rows.clear();
}

void write_captions(const Output& o) {
  h5::Handle type = h5::type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  const hsize_t n = o.captions.size();
  h5::Handle space = h5::space(H5Screate_simple(1, &n, nullptr));
  h5::Handle set = h5::dataset(H5Dcreate2(
      o.file.get(),
      layout::kCaptions,
      type.get(),
      space.get(),
      H5P_DEFAULT,
      H5P_DEFAULT,
      H5P_DEFAULT));
  std::vector<const char*> ptrs;
  for (const std::string& c : o.captions)
    ptrs.push_back(c.c_str());
  MT_CHECK(
      set.valid() && H5Dwrite(
                         set.get(),
                         type.get(),
                         H5S_ALL,
                         H5S_ALL,
                         H5P_DEFAULT,
                         ptrs.data()) >= 0,
      kCmd,
      ": cannot write /captions to '",
      o.tmp,
      "': ",
      h5::write_reason(o.file.get()));
}

void write_rest(
    Output* o,
    const CaptionConvertSpec& spec,
    const CaptionConvertResult& r,
    int64_t images) {
  const hid_t f = o->file.get();
  h5::write_dataset(
      f,
      layout::kPairIds,
      H5T_STD_I64LE,
      H5T_NATIVE_INT64,
      {o->pair_ids.size()},
      {std::min<hsize_t>(o->pair_ids.size(), 8192)},
      o->pair_ids.data());
  if (spec.write_captions)
    write_captions(*o);
  // uint8 in [0, 255] -> [0, 1], as convert-images writes.
  h5::write_attr(o->images.get(), layout::kScale, 1.0 / 255.0);
  h5::write_attr(o->images.get(), layout::kShift, 0.0);
  const hid_t t = o->tokens.get();
  h5::write_attr(t, layout::kVocabSize, int64_t{ClipTokenizer::kVocabSize});
  h5::write_attr(t, layout::kStartToken, int64_t{ClipTokenizer::kStartToken});
  h5::write_attr(t, layout::kEndToken, int64_t{ClipTokenizer::kEndToken});
  h5::write_attr(t, layout::kPadToken, int64_t{0});
  h5::write_attr(
      t,
      layout::kTokenizer,
      std::string("open_clip 3.3.0 SimpleTokenizer (clean=lower), "
                  "bpe_simple_vocab_16e6"));
  h5::write_attr(f, layout::kLayoutVersion, layout::kVersion);
  h5::write_attr(f, layout::kKind, std::string("pairs"));
  h5::write_attr(f, layout::kVocabSize, int64_t{ClipTokenizer::kVocabSize});
  h5::write_attr(f, layout::kContextLength, spec.context_length);
  h5::write_attr(f, layout::kSource, spec.csv);
  h5::write_attr(
      f,
      layout::kGenerator,
      spec.command.empty() ? std::string("memtrain convert-captions")
                           : spec.command);
  h5::write_attr(f, layout::kSplit, o->split);
  h5::write_attr(
      f, layout::kNumPairs, static_cast<int64_t>(o->pair_ids.size()));
  h5::write_attr(f, layout::kNumImages, images);
  h5::write_attr(
      f, layout::kSkippedRows, static_cast<int64_t>(r.skipped.size()));
  h5::write_attr(
      f, layout::kTruncatedCaptions, static_cast<int64_t>(r.truncated.size()));
  h5::write_attr(f, layout::kImageSize, spec.size);
  h5::write_attr(f, layout::kSeed, static_cast<int64_t>(spec.seed));
  h5::write_attr(f, layout::kValFraction, spec.val_fraction);
}

void check_spec(const CaptionConvertSpec& spec, const std::string& val_path) {
  MT_CHECK(!spec.csv.empty(), kCmd, ": --csv is required");
  MT_CHECK(!spec.out.empty(), kCmd, ": --out is required");
  MT_CHECK(
      spec.size >= 1 && spec.size <= 4096,
      kCmd,
      ": --size ",
      spec.size,
      " is not in 1..4096");
  MT_CHECK(
      spec.context_length >= 2 && spec.context_length <= 65536,
      kCmd,
      ": --context-length ",
      spec.context_length,
      " is not in 2..65536 (open_clip's CLIP models use 77)");
  MT_CHECK(
      spec.val_fraction >= 0 && spec.val_fraction < 1,
      kCmd,
      ": --val-fraction ",
      spec.val_fraction,
      " is not in [0, 1)");
  MT_CHECK(
      spec.val_fraction == 0 || val_path != spec.out,
      kCmd,
      ": --val-out '",
      val_path,
      "' is --out too");
  MT_CHECK(
      spec.sep != '"' && spec.sep != '\n' && spec.sep != '\r',
      kCmd,
      ": --sep ",
      sep_name(spec.sep),
      " cannot separate fields (it is the quote or a line break)");
}

}  // namespace

CaptionConvertResult convert_captions(
    const CaptionConvertSpec& spec,
    const std::function<void(const char*, const CaptionRowReport&)>& on_row) {
  h5::silence_errors();
  const bool with_val = spec.val_fraction > 0;
  const std::string val_path =
      spec.val_out.empty() ? h5::path_stem(spec.out) + "-val.h5" : spec.val_out;
  check_spec(spec, val_path);
  // The CSV first: its refusals do not wait for the vocabulary.
  std::vector<CaptionCsvRow> csv_rows = read_caption_csv(spec);

  std::string looked;
  const std::string bpe =
      spec.bpe.empty() ? ClipTokenizer::default_bpe_path(&looked) : spec.bpe;
  MT_CHECK(
      !bpe.empty(),
      kCmd,
      ": no CLIP BPE vocabulary found (looked at ",
      looked,
      "); pass --bpe FILE, open_clip's bpe_simple_vocab_16e6.txt.gz (bash "
      "launch/install_peers.sh installs open_clip into the torch venv), or "
      "set MEMTRAIN_CLIP_BPE");
  std::unique_ptr<ClipTokenizer> tokenizer;
  try {
    tokenizer = std::make_unique<ClipTokenizer>(bpe);
  } catch (const Error& e) {
    throw Error(std::string(kCmd) + ": " + e.what());
  }

  // Rows and their distinct images.
  std::vector<Row> rows;
  std::vector<Image> images;
  std::map<std::string, int64_t> image_of;  // normalised file -> image
  for (CaptionCsvRow& csv_row : csv_rows) {
    Row row{
        csv_row.line, std::move(csv_row.path), std::move(csv_row.caption), -1};
    if (!row.path.empty()) {
      const fs::path p(row.path);
      const fs::path file = (p.is_absolute() || spec.images_root.empty()
                                 ? p
                                 : fs::path(spec.images_root) / p)
                                .lexically_normal();
      const auto [it, fresh] = image_of.emplace(
          file.generic_string(), static_cast<int64_t>(images.size()));
      if (fresh) {
        images.emplace_back();
        images.back().spelling = p.lexically_normal().generic_string();
        images.back().file = file;
      }
      row.image = it->second;
      ++images[row.image].rows_left;
    }
    rows.push_back(std::move(row));
  }
  CaptionConvertResult r;
  r.rows = static_cast<int64_t>(rows.size());
  MT_CHECK(!rows.empty(), kCmd, ": --csv '", spec.csv, "' has no data rows");

  // The split rule (counter_rng.h), over the images the CSV names.
  std::vector<size_t> order(images.size());
  std::iota(order.begin(), order.end(), 0);
  std::vector<uint64_t> keys(images.size());
  for (size_t i = 0; i < images.size(); ++i)
    keys[i] = split_key(images[i].spelling, spec.seed);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return keys[a] != keys[b] ? keys[a] < keys[b]
                              : images[a].spelling < images[b].spelling;
  });
  const int64_t nval =
      with_val
          ? val_count(static_cast<int64_t>(images.size()), spec.val_fraction)
          : 0;
  for (int64_t i = 0; i < nval; ++i)
    images[order[i]].val = true;

  TempFiles temps;  // destroyed after the outputs: closed, then removed
  Output train, val;
  train.path = spec.out;
  train.split = "train";
  val.path = val_path;
  val.split = "val";
  open_output(&train, spec, &temps);
  if (with_val)
    open_output(&val, spec, &temps);

  for (Row& row : rows) {
    auto report = [&](std::vector<CaptionRowReport>* list,
                      const char* kind,
                      std::string what,
                      std::string why) {
      list->push_back({row.line, std::move(what), std::move(why)});
      if (on_row)
        on_row(kind, list->back());
    };
    if (row.image < 0) {
      report(
          &r.skipped,
          "skipped",
          "''",
          "empty image path (" + spec.img_key + ")");
      continue;
    }
    Image& im = images[row.image];
    const bool last_use = --im.rows_left == 0;
    std::vector<uint8_t> pixels;
    if (im.broken.empty() && im.pixels.empty()) {
      std::string why;
      const std::string bytes = read_image(im.file, &why);
      if (why.empty()) {
        try {
          pixels = resize_center_crop(decode_image(bytes), spec.size);
        } catch (const Error& e) {
          why = e.what();
        }
      }
      im.broken = why;
      if (why.empty() && !last_use)
        im.pixels = pixels;
    } else if (im.broken.empty()) {
      pixels = last_use ? std::move(im.pixels) : im.pixels;
    }
    if (!im.broken.empty()) {
      report(&r.skipped, "skipped", im.file.string(), im.broken);
      continue;
    }
    std::vector<int32_t> ids;
    int64_t full = 0;
    try {
      ids = tokenizer->tokenize(row.caption, spec.context_length, &full);
    } catch (const Error& e) {
      report(&r.skipped, "skipped", im.file.string(), e.what());
      continue;
    }
    if (full > spec.context_length) {
      std::ostringstream why;
      why << full << " tokens with start and end, cut to --context-length "
          << spec.context_length << " (the end token kept last)";
      report(&r.truncated, "truncated", caption_start(row.caption), why.str());
    }
    Output* o = im.val ? &val : &train;
    o->pixel_rows.insert(o->pixel_rows.end(), pixels.begin(), pixels.end());
    o->token_rows.insert(o->token_rows.end(), ids.begin(), ids.end());
    const auto id = o->local_id.emplace(
        row.image, static_cast<int64_t>(o->local_id.size()));
    o->pair_ids.push_back(id.first->second);
    if (spec.write_captions)
      o->captions.push_back(row.caption);
    if (o->pixel_rows.size() >= (64u << 20))
      flush(o, spec.size, spec.context_length);
  }

  const size_t written = train.pair_ids.size() + val.pair_ids.size();
  MT_CHECK(
      written > 0,
      kCmd,
      ": --csv '",
      spec.csv,
      "': no usable row (",
      r.skipped.size(),
      " of ",
      rows.size(),
      " skipped; see the 'skipped:' lines); check --images-root");
  MT_CHECK(
      !train.pair_ids.empty(),
      kCmd,
      ": --val-fraction ",
      spec.val_fraction,
      " leaves no training pair; lower it");
  MT_CHECK(
      !with_val || !val.pair_ids.empty(),
      kCmd,
      ": --val-fraction ",
      spec.val_fraction,
      " gives no validation pair (round(fraction x images) is 0, or its "
      "images are broken); raise it, or pass 0 for no validation file");

  for (Output* o : {&train, &val}) {
    if (o == &val && !with_val)
      continue;
    flush(o, spec.size, spec.context_length);
    const auto n_images = static_cast<int64_t>(o->local_id.size());
    write_rest(o, spec, r, n_images);
    o->images.reset();
    o->tokens.reset();
    h5::finish_file(&o->file, kCmd);
  }
  r.train_path = train.path;
  r.train_rows = static_cast<int64_t>(train.pair_ids.size());
  r.train_images = static_cast<int64_t>(train.local_id.size());
  if (with_val) {
    r.val_path = val.path;
    r.val_rows = static_cast<int64_t>(val.pair_ids.size());
    r.val_images = static_cast<int64_t>(val.local_id.size());
  }
  for (size_t i = 0; i < temps.paths.size(); ++i)
    temps.publish(i, (i == 0 ? train : val).path, kCmd);
  return r;
}

}  // namespace memtrain
