#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "commands.h"
#include "memtrain/convert/caption_convert.h"
#include "memtrain/util/atomic_file.h"
#include "memtrain/util/error.h"

namespace memtrain::cli {
namespace {
CaptionConvertSpec spec;
std::string sep = "\\t";
bool no_captions = false;
}  // namespace

void add_convert_captions(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "convert-captions",
      "Convert image-caption pairs listed in a CSV (open_clip's CsvDataset "
      "convention: a header row, an image-path column and a caption column, "
      "tab-separated by default) into memtrain's HDF5 pair layout: /images "
      "uint8 [N, 3, S, S] (decoded and resized as convert-images does), "
      "/tokens int32 [N, L] (open_clip.tokenize's ids), /pair_ids (rows of "
      "one image share an id) and /captions. Broken images are skipped and "
      "named by CSV line; over-long captions are cut as open_clip cuts them "
      "and named too.");
  cmd->add_option("--csv", spec.csv, "the CSV file")->required();
  cmd->add_option(
      "--images-root",
      spec.images_root,
      "folder that relative image paths are below: one that leaves it "
      "(../) is refused; an absolute path is read as written (default: the "
      "current folder, as open_clip opens them, .. included)");
  cmd->add_option("--out", spec.out, "training file (.h5)")->required();
  cmd->add_option(
      "--val-out",
      spec.val_out,
      "validation file (default: OUT without .h5 + -val.h5)");
  cmd->add_option(
         "--sep",
         sep,
         "field separator, one character ('\\t' for a tab: open_clip's "
         "--csv-separator default)")
      ->capture_default_str();
  cmd->add_option(
         "--img-key",
         spec.img_key,
         "image path column (open_clip's --csv-img-key)")
      ->capture_default_str();
  cmd->add_option(
         "--caption-key",
         spec.caption_key,
         "caption column (open_clip's --csv-caption-key)")
      ->capture_default_str();
  cmd->add_option(
         "--size",
         spec.size,
         "output images are SIZE x SIZE: shorter side resized to SIZE, then "
         "centre-cropped")
      ->capture_default_str();
  cmd->add_option(
         "--context-length",
         spec.context_length,
         "token ids per caption, L of /tokens [N, L] (start and end tokens "
         "included; zero padded)")
      ->capture_default_str();
  cmd->add_option(
      "--bpe",
      spec.bpe,
      "CLIP's BPE vocabulary, open_clip's bpe_simple_vocab_16e6.txt.gz "
      "(default: $MEMTRAIN_CLIP_BPE, else open_clip's copy in the torch venv)");
  cmd->add_option(
         "--val-fraction",
         spec.val_fraction,
         "share of the images (with all their captions) for validation, in "
         "[0, 1); 0: no validation file")
      ->capture_default_str();
  cmd->add_option("--seed", spec.seed, "seed of the split's draw")
      ->capture_default_str();
  cmd->add_flag(
      "--no-captions", no_captions, "leave the /captions strings out");
}

int run_convert_captions() {
  spec.command = "memtrain convert-captions";
  MT_CHECK(
      sep == "\\t" || sep.size() == 1,
      "convert-captions: --sep '",
      sep,
      "' is not one character (pass '\\t' for a tab)");
  spec.sep = sep == "\\t" ? '\t' : sep[0];
  spec.write_captions = !no_captions;
  make_parent_directories(spec.out);
  if (spec.val_fraction > 0 && !spec.val_out.empty())
    make_parent_directories(spec.val_out);
  // Each report on stderr as it comes, one line: "skipped: line L: PATH:
  // REASON", "truncated: line L: 'CAPTION START...': REASON".
  const CaptionConvertResult r =
      convert_captions(spec, [](const char* kind, const CaptionRowReport& row) {
        std::fprintf(
            stderr,
            "%s: line %ld: %s: %s\n",
            kind,
            static_cast<long>(row.line),
            row.what.c_str(),
            row.reason.c_str());
      });
  const auto s = static_cast<long>(spec.size);
  const auto l = static_cast<long>(spec.context_length);
  auto wrote = [&](const std::string& path,
                   const char* split,
                   int64_t n,
                   int64_t images) {
    std::printf(
        "wrote %s (%s): /images [%ld, 3, %ld, %ld] uint8, /tokens [%ld, %ld] "
        "int32, %ld images\n",
        path.c_str(),
        split,
        static_cast<long>(n),
        s,
        s,
        static_cast<long>(n),
        l,
        static_cast<long>(images));
  };
  wrote(r.train_path, "train", r.train_rows, r.train_images);
  if (!r.val_path.empty())
    wrote(r.val_path, "val", r.val_rows, r.val_images);
  std::printf(
      "rows: %ld; written: %ld (train %ld, val %ld); skipped (broken): %zu; "
      "captions truncated: %zu\n",
      static_cast<long>(r.rows),
      static_cast<long>(r.train_rows + r.val_rows),
      static_cast<long>(r.train_rows),
      static_cast<long>(r.val_rows),
      r.skipped.size(),
      r.truncated.size());
  return 0;
}

}  // namespace memtrain::cli
