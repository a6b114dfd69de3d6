#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "commands.h"
#include "memtrain/convert/image_convert.h"
#include "memtrain/util/atomic_file.h"

namespace memtrain::cli {
namespace {
ImageConvertSpec spec;
}  // namespace

void add_convert_images(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "convert-images",
      "Convert an image folder (FOLDER/CLASS/IMAGE.jpg|.jpeg|.png, one "
      "subfolder per class, torchvision's ImageFolder layout) into "
      "memtrain's HDF5 image layout (/images uint8 [N, 3, S, S] + /labels, "
      "docs/data-format.md): --out gets the training images, OUT-val.h5 (or "
      "--val-out) a seeded per-class share for validation. Unreadable "
      "images are skipped and named.");
  cmd->add_option("--folder", spec.folder, "the image folder")->required();
  cmd->add_option("--out", spec.out, "training file (.h5)")->required();
  cmd->add_option(
      "--val-out",
      spec.val_out,
      "validation file (default: OUT without .h5 + -val.h5)");
  cmd->add_option(
         "--size",
         spec.size,
         "output images are SIZE x SIZE: shorter side resized to SIZE, then "
         "centre-cropped")
      ->capture_default_str();
  cmd->add_option(
         "--val-fraction",
         spec.val_fraction,
         "share of each class's images for validation, in [0, 1); 0: no "
         "validation file")
      ->capture_default_str();
  cmd->add_option("--seed", spec.seed, "seed of the split's draw")
      ->capture_default_str();
  cmd->add_option(
      "--classes",
      spec.classes,
      "convert only the class folders this split file lists: a CSV with a "
      "'label' column (miniImageNet's train.csv / val.csv / test.csv, "
      "filename,label rows) or one class name per line; a listed class "
      "without a folder is an error");
}

int run_convert_images() {
  spec.command = "memtrain convert-images";
  make_parent_directories(spec.out);
  if (spec.val_fraction > 0 && !spec.val_out.empty())
    make_parent_directories(spec.val_out);
  // Skipped files and decoder warnings on stderr as they come, one line
  // each: "skipped: PATH: REASON", "warning: PATH: MESSAGE (kept)".
  const ImageConvertResult r = convert_images(
      spec,
      [](const std::string& line) {
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
      },
      [](const char* what, const SkippedImage& s) {
        std::fprintf(
            stderr,
            "%s: %s: %s%s\n",
            what,
            s.path.c_str(),
            s.reason.c_str(),
            what[0] == 'w' ? " (kept)" : "");
      });
  int64_t train = 0, val = 0;
  for (size_t c = 0; c < r.class_names.size(); ++c) {
    train += r.train_per_class[c];
    val += r.val_per_class[c];
  }
  const auto s = static_cast<long>(spec.size);
  std::printf(
      "wrote %s (train): /images [%ld, 3, %ld, %ld] uint8, %zu classes\n",
      r.train_path.c_str(),
      static_cast<long>(train),
      s,
      s,
      r.class_names.size());
  if (!r.val_path.empty())
    std::printf(
        "wrote %s (val): /images [%ld, 3, %ld, %ld] uint8, %zu classes\n",
        r.val_path.c_str(),
        static_cast<long>(val),
        s,
        s,
        r.class_names.size());
  std::printf(
      "images: %ld (train %ld, val %ld); skipped (unreadable): %zu; "
      "decoded with warnings: %zu; other files ignored: %ld",
      static_cast<long>(train + val),
      static_cast<long>(train),
      static_cast<long>(val),
      r.skipped.size(),
      r.warnings.size(),
      static_cast<long>(r.ignored));
  if (!r.ignored_extensions.empty()) {
    std::printf(" (");
    for (size_t i = 0; i < r.ignored_extensions.size(); ++i)
      std::printf("%s%s", i ? " " : "", r.ignored_extensions[i].c_str());
    std::printf(")");
  }
  std::printf("; hidden entries: %ld\n", static_cast<long>(r.hidden));
  return 0;
}

}  // namespace memtrain::cli
