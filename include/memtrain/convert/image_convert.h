#pragma once
// An image folder (one subfolder per class of JPEG/PNG files, torchvision's
// ImageFolder layout) to memtrain's HDF5 image layout (docs/data-format.md,
// `/images` uint8 [N, 3, S, S] + `/labels`): `memtrain convert-images`.
// Decoding and resizing: formats/images/image_decode.h; the split is here.
// No LibTorch.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "memtrain/util/counter_rng.h"

namespace memtrain {

struct ImageConvertSpec {
  std::string folder;         // FOLDER/CLASS/.../IMAGE
  std::string out;            // training images
  std::string val_out;        // "": out's stem + "-val.h5"
  int64_t size = 224;         // output S x S
  double val_fraction = 0.1;  // per class, in [0, 1); 0: no validation file
  uint64_t seed = 0;          // the split's draw
  std::string command;        // written as the `generator` attribute
  // "": every class folder; else a split file naming the classes to
  // convert (convert_images below), e.g. miniImageNet's train.csv.
  std::string classes;
};

struct SkippedImage {
  std::string path;
  std::string reason;
};

struct ImageConvertResult {
  std::vector<std::string> class_names;  // sorted; label = position
  std::vector<int64_t> train_per_class;
  std::vector<int64_t> val_per_class;
  std::string train_path;
  std::string val_path;                // "" when val_fraction is 0
  std::vector<SkippedImage> skipped;   // unreadable .jpg/.jpeg/.png files
  std::vector<SkippedImage> warnings;  // decoded, but the decoder warned
  int64_t ignored = 0;  // files with another extension (not images here)
  int64_t hidden = 0;   // dot-files and dot-folders inside class folders
  std::vector<std::string> ignored_extensions;  // e.g. ".txt" (sorted, unique)
};

// Converts spec.folder and writes spec.out (and the validation file), each
// atomically: a temporary file beside it, renamed when complete, removed on
// any error, so an existing output is only replaced by a complete one.
// Classes: the folder's subfolders that do not start with '.', sorted by
// byte value; a class's images: every .jpg, .jpeg or .png file (any case)
// below its folder (subfolders too, dot-names left out), sorted by path.
// Each image is decoded (format from its first bytes), made RGB (gray
// replicated, alpha dropped), resized so its shorter side is `size` and
// centre-cropped to size x size (resize_center_crop). An unreadable image is
// skipped with the decoder's reason. `progress` (may be empty) gets one line
// per class; `on_file` (may be empty) each skipped file ("skipped") and each
// decoder warning ("warning") as it happens, so that they are reported even
// when the conversion fails later. Throws memtrain::Error on bad flags, a
// missing folder, no class folder, a class name with a comma, a class without a
// readable image, an empty split, or a write failure.
// With spec.classes, only the class folders that file lists are converted
// (labels: their sorted order), so that miniImageNet-style split files
// (Ravi & Larochelle's train.csv / val.csv / test.csv, 64 / 16 / 20
// classes) make one file per split from one folder of class folders. The
// file is either a CSV whose first line is a header with a `label` column
// (`filename,label` rows; each label is a class, repeated once per image)
// or one class name per line; blank lines are skipped, a trailing \r and
// surrounding spaces dropped. A listed class without a folder, a repeated
// line of a one-per-line file, a CSV row without its label or an empty
// list is refused naming the file and the line.
ImageConvertResult convert_images(
    const ImageConvertSpec& spec,
    const std::function<void(const std::string&)>& progress = {},
    const std::function<void(const char*, const SkippedImage&)>& on_file = {});

// The split rule: the image at path `relative` (inside its class folder,
// '/'-separated) has the key split_key(relative, seed); in each class the
// val_count(n, fraction) readable images with the smallest keys (ties: by
// path) go to validation. Both live in counter_rng.h (convert-dataset
// splits cases with them too).

}  // namespace memtrain
