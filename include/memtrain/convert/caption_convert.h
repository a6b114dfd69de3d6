#pragma once
// Image-caption pairs listed in a CSV (open_clip's CsvDataset convention) to
// memtrain's HDF5 pair layout with token ids for tower b (docs/data-format.md,
// Pairs): `memtrain convert-captions`. Images are decoded and resized as
// convert-images does (formats/images/image_decode.h), captions tokenized as
// open_clip.tokenize (clip_tokenizer.h). No LibTorch.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace memtrain {

struct CaptionConvertSpec {
  std::string csv;          // the table: a header row, one pair a row
  std::string images_root;  // relative image paths are below it ("": cwd,
                            // where ".." may lead out, as in open_clip)
  std::string out;          // training pairs
  std::string val_out;      // "": out's stem + "-val.h5"
  std::string bpe;          // "": ClipTokenizer::default_bpe_path()
  char sep = '\t';          // open_clip's --csv-separator default
  std::string img_key = "filepath";   // open_clip's --csv-img-key
  std::string caption_key = "title";  // open_clip's --csv-caption-key
  int64_t size = 224;                 // output S x S
  int64_t context_length = 77;        // L of /tokens [N, L]
  double val_fraction = 0;            // share of the images, in [0, 1)
  uint64_t seed = 0;                  // the split's draw
  bool write_captions = true;         // /captions (provenance)
  std::string command;                // written as the `generator` attribute
};

// One CSV row that was skipped or changed: its line in the file, the image
// path (skipped) or the caption's start (truncated), and why.
struct CaptionRowReport {
  int64_t line = 0;
  std::string what;
  std::string reason;
};

struct CaptionConvertResult {
  std::string train_path, val_path;  // val_path "" without a split
  int64_t rows = 0;                  // data rows of the CSV
  int64_t train_rows = 0, val_rows = 0;
  int64_t train_images = 0, val_images = 0;  // distinct images written
  std::vector<CaptionRowReport> skipped;     // broken rows, not written
  std::vector<CaptionRowReport> truncated;   // written, caption cut
};

// Converts spec.csv and writes spec.out (and the validation file), each
// atomically (a temporary file beside it, renamed when complete). Rows keep
// the CSV's order. A row's image is decoded, made RGB and resized as
// convert-images does; a row whose image is missing, unreadable or
// undecodable, or whose image path or caption is unusable (empty path,
// caption not UTF-8), is skipped and reported; a caption longer than
// context_length tokens is cut as open_clip cuts it and reported. Rows
// naming the same image (the same path once joined to images_root and
// normalised) share a pair id and go to the same file: the split draws
// val_count(images, val_fraction) images, those with the smallest
// split_key(path as the CSV writes it, normalised, seed) (ties: by path),
// over every image the CSV names (a broken one is then dropped). `on_row`
// (may be empty) gets each report as it happens, kind "skipped" or
// "truncated". Throws memtrain::Error on bad flags, an unreadable or
// malformed CSV, a missing or twice named column (naming the columns
// found), a row without a caption or with an empty one, a relative image
// path leaving images_root (src/convert/caption_csv.h has the rules), no
// BPE file, no row left, an empty split, or a write failure.
CaptionConvertResult convert_captions(
    const CaptionConvertSpec& spec,
    const std::function<void(const char*, const CaptionRowReport&)>& on_row =
        {});

}  // namespace memtrain
