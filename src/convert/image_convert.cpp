// memtrain convert-images: an ImageFolder tree to /images + /labels files.
// Decoding and resizing: image_decode.cpp.

#include "memtrain/convert/image_convert.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include "data/h5/h5_util.h"
#include "data/h5/layout.h"
#include "memtrain/formats/images/image_decode.h"
#include "memtrain/util/counter_rng.h"
#include "memtrain/util/error.h"
#include "memtrain/util/file_kind.h"
#include "memtrain/util/temp_path.h"
#include "util/temp_files.h"

namespace memtrain {
namespace fs = std::filesystem;
namespace {

bool hidden(const fs::path& p) {
  const std::string n = p.filename().string();
  return !n.empty() && n[0] == '.';
}

std::string lower(std::string s) {
  for (char& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

struct Candidate {
  std::string relative;  // inside the class folder, '/'-separated
  fs::path path;
  std::string unreadable;  // why it is not a file to read ("" if it is)
};

// One output file while it is written: a temporary file beside `path`.
struct Output {
  std::string path, split, tmp;
  h5::Handle file, images;
  std::vector<int64_t> labels;
  std::vector<int64_t> per_class;
};

void open_output(Output* o, int64_t size, TempFiles* temps) {
  remove_stale_temp_files(o->path);
  o->tmp = temp_path_for(o->path);
  temps->paths.push_back(o->tmp);
  o->file = h5::create_file(o->tmp, "convert-images");
  const hsize_t s = static_cast<hsize_t>(size);
  // One sample a chunk (docs/data-format.md): a random read touches one chunk.
  o->images = h5::create_dataset(
      o->file.get(),
      layout::kImages,
      H5T_STD_U8LE,
      {0, 3, s, s},
      {1, 3, s, s},
      true);
}

bool read_bytes(const fs::path& p, std::string* out, std::string* why) {
  std::ifstream in(p, std::ios::binary | std::ios::ate);
  if (in) {
    const std::streamoff size = in.tellg();
    out->resize(size > 0 ? static_cast<size_t>(size) : 0);
    in.seekg(0);
    if (in.read(out->data(), static_cast<std::streamsize>(out->size())))
      return true;
  }
  *why = std::string("cannot read: ") + std::strerror(errno);
  return false;
}

std::vector<Candidate> list_class(
    const fs::path& dir, ImageConvertResult* r, std::set<std::string>* exts) {
  std::vector<Candidate> files;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const fs::directory_entry& e = *it;
    if (hidden(e.path())) {
      ++r->hidden;
      if (e.is_directory(ec))
        it.disable_recursion_pending();
      ec.clear();
      continue;
    }
    if (e.is_directory(ec)) {
      continue;
    }
    ec.clear();  // a symbolic link loop or a broken link: handled below
    const bool regular = e.is_regular_file(ec);
    ec.clear();
    const std::string ext = lower(e.path().extension().string());
    if (ext != ".jpg" && ext != ".jpeg" && ext != ".png") {
      ++r->ignored;
      exts->insert(ext.empty() ? "(no extension)" : ext);
      continue;
    }
    // An image's name on something that is not a file (a FIFO, a link
    // loop) is skipped with its reason like an undecodable one, never
    // dropped unsaid.
    files.push_back(
        {e.path().lexically_relative(dir).generic_string(),
         e.path(),
         regular ? "" : not_a_regular_file(e.path().string())});
  }
  MT_CHECK(
      !ec, "convert-images: cannot list '", dir.string(), "': ", ec.message());
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) {
    return a.relative < b.relative;
  });
  return files;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos)
    return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

std::vector<std::string> split_commas(const std::string& line) {
  std::vector<std::string> fields;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, ','))
    fields.push_back(trim(field));
  if (!line.empty() && line.back() == ',')
    fields.push_back("");
  return fields;
}

// A class a --classes file names and the line that first names it.
struct ListedClass {
  std::string name;
  int64_t line;
};

// The classes of a --classes file (convert_images in image_convert.h), in
// the order of their first line.
std::vector<ListedClass> read_class_list(const std::string& path) {
  std::ifstream in(path);
  MT_CHECK(
      in,
      "convert-images: --classes '",
      path,
      "': cannot open: ",
      std::strerror(errno));
  const std::string where = "convert-images: --classes '" + path + "' line ";
  std::vector<ListedClass> out;
  std::vector<std::string> header;  // a CSV's, else empty
  size_t label_col = 0;
  std::string raw;
  for (int64_t line = 1; std::getline(in, raw); ++line) {
    const std::string text = trim(raw);
    if (text.empty())
      continue;
    if (out.empty() && header.empty() && text.find(',') != std::string::npos) {
      header = split_commas(text);
      const auto it = std::find(header.begin(), header.end(), "label");
      MT_CHECK(
          it != header.end(),
          where,
          line,
          ": a CSV header without a 'label' column ('",
          text,
          "'); give filename,label rows (Ravi & Larochelle's split files) "
          "or one class name per line");
      label_col = static_cast<size_t>(it - header.begin());
      continue;
    }
    std::string name = text;
    if (!header.empty()) {
      const std::vector<std::string> fields = split_commas(text);
      MT_CHECK(
          fields.size() > label_col && !fields[label_col].empty(),
          where,
          line,
          ": no value in the 'label' column (column ",
          label_col + 1,
          " of ",
          header.size(),
          "): '",
          text,
          "'");
      name = fields[label_col];
    }
    MT_CHECK(
        name[0] != '.' && name.find('/') == std::string::npos,
        where,
        line,
        ": '",
        name,
        "' is not a class folder's name (a hidden name or a path)");
    const auto seen =
        std::find_if(out.begin(), out.end(), [&](const ListedClass& c) {
          return c.name == name;
        });
    if (seen == out.end()) {
      out.push_back({name, line});
      continue;
    }
    // A CSV names a class once per image; a list names it once.
    MT_CHECK(
        !header.empty(),
        where,
        line,
        ": class '",
        name,
        "' again (first on line ",
        seen->line,
        "); list each class once");
  }
  MT_CHECK(
      !out.empty(),
      "convert-images: --classes '",
      path,
      "' names no class; give one class per line or filename,label rows");
  return out;
}

void write_attrs(
    const Output& o,
    const ImageConvertSpec& spec,
    const ImageConvertResult& r,
    const std::string& names) {
  const hid_t f = o.file.get();
  h5::write_dataset(
      f,
      layout::kLabels,
      H5T_STD_I64LE,
      H5T_NATIVE_INT64,
      {o.labels.size()},
      {std::min<hsize_t>(o.labels.size(), 8192)},
      o.labels.data());
  // uint8 in [0, 255] -> [0, 1], what the reader does without them too.
  h5::write_attr(o.images.get(), layout::kScale, 1.0 / 255.0);
  h5::write_attr(o.images.get(), layout::kShift, 0.0);
  h5::write_attr(f, layout::kLayoutVersion, layout::kVersion);
  h5::write_attr(f, layout::kKind, std::string("images"));
  h5::write_attr(
      f, layout::kNumClasses, static_cast<int64_t>(r.class_names.size()));
  h5::write_attr(f, layout::kClassNames, names);
  h5::write_attr(f, layout::kSource, spec.folder);
  h5::write_attr(
      f,
      layout::kGenerator,
      spec.command.empty() ? std::string("memtrain convert-images")
                           : spec.command);
  h5::write_attr(f, layout::kSplit, o.split);
  h5::write_attr(f, layout::kNumImages, static_cast<int64_t>(o.labels.size()));
  std::string counts;
  for (size_t c = 0; c < r.class_names.size(); ++c)
    counts += (c ? "," : "") + r.class_names[c] + "=" +
              std::to_string(o.per_class[c]);
  h5::write_attr(f, layout::kImagesPerClass, counts);
  h5::write_attr(
      f, layout::kSkippedFiles, static_cast<int64_t>(r.skipped.size()));
  h5::write_attr(f, layout::kImageSize, spec.size);
  h5::write_attr(f, layout::kSeed, static_cast<int64_t>(spec.seed));
  h5::write_attr(f, layout::kValFraction, spec.val_fraction);
}

}  // namespace

ImageConvertResult convert_images(
    const ImageConvertSpec& spec,
    const std::function<void(const std::string&)>& progress,
    const std::function<void(const char*, const SkippedImage&)>& on_file) {
  h5::silence_errors();
  MT_CHECK(!spec.folder.empty(), "convert-images: --folder is required");
  MT_CHECK(!spec.out.empty(), "convert-images: --out is required");
  MT_CHECK(
      spec.size >= 1 && spec.size <= 4096,
      "convert-images: --size ",
      spec.size,
      " is not in 1..4096");
  MT_CHECK(
      spec.val_fraction >= 0 && spec.val_fraction < 1,
      "convert-images: --val-fraction ",
      spec.val_fraction,
      " is not in [0, 1)");
  const bool with_val = spec.val_fraction > 0;
  const std::string val_path =
      spec.val_out.empty() ? h5::path_stem(spec.out) + "-val.h5" : spec.val_out;
  MT_CHECK(
      !with_val || val_path != spec.out,
      "convert-images: --val-out '",
      val_path,
      "' is --out too");

  std::error_code ec;
  const fs::path root(spec.folder);
  MT_CHECK(
      fs::exists(root, ec),
      "convert-images: --folder '",
      spec.folder,
      "': no such folder");
  MT_CHECK(
      fs::is_directory(root, ec),
      "convert-images: --folder '",
      spec.folder,
      "': not a folder");
  ImageConvertResult r;
  std::vector<fs::path> class_dirs;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end;
       it.increment(ec)) {
    if (hidden(it->path()))
      continue;
    if (it->is_directory(ec))
      class_dirs.push_back(it->path());
  }
  MT_CHECK(
      !ec,
      "convert-images: --folder '",
      spec.folder,
      "': cannot list: ",
      ec.message());
  std::sort(
      class_dirs.begin(), class_dirs.end(), [](const auto& a, const auto& b) {
        return a.filename().string() < b.filename().string();
      });
  MT_CHECK(
      !class_dirs.empty(),
      "convert-images: --folder '",
      spec.folder,
      "' has no class subfolders (expected FOLDER/CLASS/IMAGE.jpg, one "
      "subfolder per class, as torchvision's ImageFolder)");
  if (!spec.classes.empty()) {
    // Only the listed class folders, still in sorted order.
    const std::vector<ListedClass> listed = read_class_list(spec.classes);
    std::set<std::string> wanted;
    for (const ListedClass& c : listed) {
      const bool found =
          std::any_of(class_dirs.begin(), class_dirs.end(), [&](const auto& d) {
            return d.filename().string() == c.name;
          });
      MT_CHECK(
          found,
          "convert-images: --classes '",
          spec.classes,
          "' line ",
          c.line,
          ": class '",
          c.name,
          "' has no folder '",
          (root / c.name).string(),
          "'; add the folder or fix the split file");
      wanted.insert(c.name);
    }
    const size_t folders = class_dirs.size();
    class_dirs.erase(
        std::remove_if(
            class_dirs.begin(),
            class_dirs.end(),
            [&](const fs::path& d) {
              return wanted.count(d.filename().string()) == 0;
            }),
        class_dirs.end());
    if (progress)
      progress(
          "classes: " + std::to_string(class_dirs.size()) + " of " +
          std::to_string(folders) + " class folders, listed in --classes '" +
          spec.classes + "'");
  }
  std::string names;
  for (const fs::path& d : class_dirs) {
    const std::string n = d.filename().string();
    MT_CHECK(
        n.find(',') == std::string::npos,
        "convert-images: class folder '",
        d.string(),
        "': its name has a comma; class_names is a comma-separated list "
        "(docs/data-format.md): rename the folder");
    r.class_names.push_back(n);
    names += (names.empty() ? "" : ",") + n;
  }
  const size_t num_classes = class_dirs.size();

  TempFiles temps;  // destroyed after the outputs: closed, then removed
  Output train, val;
  train.path = spec.out;
  train.split = "train";
  val.path = val_path;
  val.split = "val";
  for (Output* o : {&train, &val}) {
    if (o == &val && !with_val)
      continue;
    open_output(o, spec.size, &temps);
    o->per_class.assign(num_classes, 0);
  }

  const size_t sample = static_cast<size_t>(3 * spec.size * spec.size);
  std::set<std::string> exts;
  std::vector<std::string> empty_classes;
  for (size_t c = 0; c < num_classes; ++c) {
    const std::vector<Candidate> files = list_class(class_dirs[c], &r, &exts);
    std::vector<uint8_t> pixels;
    std::vector<std::string> relative;
    const size_t skipped_before = r.skipped.size();
    for (const Candidate& f : files) {
      auto skip = [&](const std::string& why) {
        r.skipped.push_back({f.path.string(), why});
        if (on_file)
          on_file("skipped", r.skipped.back());
      };
      if (!f.unreadable.empty()) {
        skip(f.unreadable);
        continue;
      }
      std::string bytes, why;
      if (!read_bytes(f.path, &bytes, &why)) {
        skip(why);
        continue;
      }
      try {
        std::string warning;
        const RgbImage im = decode_image(bytes, &warning);
        const std::vector<uint8_t> px = resize_center_crop(im, spec.size);
        pixels.insert(pixels.end(), px.begin(), px.end());
        relative.push_back(f.relative);
        if (!warning.empty()) {
          r.warnings.push_back({f.path.string(), warning});
          if (on_file)
            on_file("warning", r.warnings.back());
        }
      } catch (const Error& e) {
        skip(e.what());
      }
    }
    const int64_t n = static_cast<int64_t>(relative.size());
    if (n == 0)
      empty_classes.push_back(class_dirs[c].string());
    // The split rule (image_convert.h): smallest keys to validation.
    std::vector<size_t> order(relative.size());
    std::iota(order.begin(), order.end(), 0);
    std::vector<uint64_t> keys(relative.size());
    for (size_t i = 0; i < relative.size(); ++i)
      keys[i] = split_key(relative[i], spec.seed);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return keys[a] != keys[b] ? keys[a] < keys[b] : relative[a] < relative[b];
    });
    const int64_t nval = with_val ? val_count(n, spec.val_fraction) : 0;
    std::vector<bool> is_val(relative.size(), false);
    for (int64_t i = 0; i < nval; ++i)
      is_val[order[i]] = true;
    for (Output* o : {&train, &val}) {
      if (o == &val && !with_val)
        continue;
      std::vector<uint8_t> rows;
      for (size_t i = 0; i < relative.size(); ++i) {
        if (is_val[i] != (o == &val))
          continue;
        rows.insert(
            rows.end(),
            pixels.begin() + i * sample,
            pixels.begin() + (i + 1) * sample);
        o->labels.push_back(static_cast<int64_t>(c));
        ++o->per_class[c];
      }
      h5::append_rows(
          o->images.get(), H5T_NATIVE_UINT8, rows.size() / sample, rows.data());
    }
    r.train_per_class.push_back(train.per_class[c]);
    r.val_per_class.push_back(with_val ? val.per_class[c] : 0);
    if (progress) {
      std::ostringstream line;
      line << "class " << c << " '" << r.class_names[c] << "': " << n
           << " images (" << train.per_class[c] << " train, "
           << r.val_per_class.back() << " val)";
      if (r.skipped.size() > skipped_before)
        line << ", " << r.skipped.size() - skipped_before << " skipped";
      progress(line.str());
    }
  }
  r.ignored_extensions.assign(exts.begin(), exts.end());

  const int64_t readable = static_cast<int64_t>(
      train.labels.size() + (with_val ? val.labels.size() : 0));
  MT_CHECK(
      readable > 0,
      "convert-images: --folder '",
      spec.folder,
      "': no readable image (",
      r.skipped.size(),
      " .jpg/.jpeg/.png files skipped as unreadable, ",
      r.ignored,
      " other files ignored)");
  if (!empty_classes.empty()) {
    std::string list;
    for (const auto& e : empty_classes)
      list += (list.empty() ? "'" : ", '") + e + "'";
    throw Error(
        "convert-images: " + std::to_string(empty_classes.size()) +
        " class folder(s) without a readable image (.jpg, .jpeg or .png): " +
        list +
        "; add images or remove the folder (its label would never "
        "occur)");
  }
  MT_CHECK(
      !train.labels.empty(),
      "convert-images: --val-fraction ",
      spec.val_fraction,
      " leaves no training image; lower it");
  MT_CHECK(
      !with_val || !val.labels.empty(),
      "convert-images: --val-fraction ",
      spec.val_fraction,
      " gives no validation image (round(fraction x images) is 0 in every "
      "class); raise it, or pass 0 for no validation file");

  r.train_path = train.path;
  write_attrs(train, spec, r, names);
  if (with_val) {
    r.val_path = val.path;
    write_attrs(val, spec, r, names);
  }
  for (Output* o : {&train, &val}) {
    o->images.reset();
    h5::finish_file(&o->file, "convert-images");
  }
  for (size_t i = 0; i < temps.paths.size(); ++i)
    temps.publish(i, (i == 0 ? train : val).path, "convert-images");
  return r;
}

}  // namespace memtrain
