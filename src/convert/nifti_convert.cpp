#include "memtrain/convert/nifti_convert.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>

#include "data/h5/h5_util.h"
#include "data/h5/layout.h"
#include "formats/nifti/nifti_read.h"
#include "memtrain/formats/nifti/nifti_volume.h"
#include "memtrain/util/error.h"
#include "memtrain/util/temp_path.h"
#include "util/temp_files.h"

namespace memtrain {
namespace {

using nifti::check_same_grid;
using nifti::Grid;
using nifti::load_data;
using nifti::Nifti;
using nifti::open_header;
using nifti::read_image;
using nifti::read_labels;
using nifti::resample;

// Planes [begin, end) along memtrain axis `axis` (1 = D, 2 = H, 3 = W) of
// a [C, D, H, W] array (mask: C = 1).
template <typename T>
std::vector<T> slab(
    const std::vector<T>& src,
    const Grid& g,
    int64_t channels,
    int axis,
    int64_t begin,
    int64_t end,
    Grid* out) {
  Grid o = g;
  o.c = channels;
  (axis == 1 ? o.d : axis == 2 ? o.h : o.w) = end - begin;
  std::vector<T> dst(o.plane() * channels);
  size_t k = 0;
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t z = 0; z < g.d; ++z) {
      if (axis == 1 && (z < begin || z >= end))
        continue;
      for (int64_t y = 0; y < g.h; ++y) {
        if (axis == 2 && (y < begin || y >= end))
          continue;
        const T* row = src.data() + ((c * g.d + z) * g.h + y) * g.w;
        if (axis == 3) {
          std::copy(row + begin, row + end, dst.data() + k);
          k += end - begin;
        } else {
          std::copy(row, row + g.w, dst.data() + k);
          k += g.w;
        }
      }
    }
  MT_INTERNAL_ASSERT(k == dst.size());
  *out = o;
  return dst;
}

struct Part {
  std::string path, split, slab_desc;
  Grid grid;
  std::vector<float> image;
  std::vector<uint8_t> mask;
};

struct Common {
  int64_t num_classes = 2;
  std::string class_names, source, label_map;
  double resample_mm = 0;
  std::array<double, 3> spacing{1, 1, 1};
  double scale = 1, shift = 0;
  int64_t chunk = 32;
};

void write_part(const Part& p, const Common& cm, const std::string& tmp) {
  h5::Handle file = h5::create_file(tmp, "convert-nifti: --out");
  const hid_t f = file.get();
  const Grid& g = p.grid;
  auto ck = [&](int64_t n) {
    return static_cast<hsize_t>(std::min(cm.chunk, n));
  };
  const std::vector<hsize_t> vdims = {
      1,
      static_cast<hsize_t>(g.c),
      static_cast<hsize_t>(g.d),
      static_cast<hsize_t>(g.h),
      static_cast<hsize_t>(g.w)};
  h5::write_dataset(
      f,
      layout::kVolumes,
      H5T_IEEE_F32LE,
      H5T_NATIVE_FLOAT,
      vdims,
      {1, static_cast<hsize_t>(g.c), ck(g.d), ck(g.h), ck(g.w)},
      p.image.data());
  h5::write_dataset(
      f,
      layout::kMasks,
      H5T_STD_U8LE,
      H5T_NATIVE_UINT8,
      {1, vdims[2], vdims[3], vdims[4]},
      {1, ck(g.d), ck(g.h), ck(g.w)},
      p.mask.data());
  {
    h5::Handle ds = h5::dataset(H5Dopen2(f, layout::kVolumes, H5P_DEFAULT));
    h5::write_attr(ds.get(), layout::kScale, cm.scale);
    h5::write_attr(ds.get(), layout::kShift, cm.shift);
  }
  h5::write_attr(f, layout::kLayoutVersion, layout::kVersion);
  h5::write_attr(f, layout::kKind, std::string("volumes"));
  h5::write_attr(f, layout::kNumClasses, cm.num_classes);
  if (!cm.class_names.empty())
    h5::write_attr(f, layout::kClassNames, cm.class_names);
  {
    const hsize_t three = 3;
    h5::Handle sp = h5::space(H5Screate_simple(1, &three, nullptr));
    h5::Handle a = h5::attribute(H5Acreate2(
        f,
        layout::kSpacingMm,
        H5T_IEEE_F64LE,
        sp.get(),
        H5P_DEFAULT,
        H5P_DEFAULT));
    MT_CHECK(
        a.valid() &&
            H5Awrite(a.get(), H5T_NATIVE_DOUBLE, cm.spacing.data()) >= 0,
        "convert-nifti: cannot write attribute 'spacing_mm' to '",
        tmp,
        "': ",
        h5::last_error());
  }
  h5::write_attr(f, layout::kSource, cm.source);
  // Provenance, ignored by the reader.
  h5::write_attr(f, layout::kGenerator, std::string("memtrain convert-nifti"));
  h5::write_attr(f, layout::kSplit, p.split);
  if (!p.slab_desc.empty())
    h5::write_attr(f, layout::kSlab, p.slab_desc);
  if (!cm.label_map.empty())
    h5::write_attr(f, layout::kLabelMap, cm.label_map);
  if (cm.resample_mm > 0)
    h5::write_attr(f, layout::kResampleMm, cm.resample_mm);
  h5::finish_file(&file, "convert-nifti");
}

}  // namespace

std::vector<ConvertedFile> convert_nifti(const ConvertSpec& spec) {
  h5::silence_errors();
  // Flags first: cheap, and before reading large files.
  MT_CHECK(!spec.out.empty(), "convert-nifti: --out is required");
  int split_axis = 0;  // memtrain axis: 1 = D (z), 2 = H (y), 3 = W (x)
  if (!spec.split_axis.empty()) {
    const std::string& a = spec.split_axis;
    split_axis = a == "z" ? 1 : a == "y" ? 2 : a == "x" ? 3 : -1;
    MT_CHECK(
        split_axis > 0,
        "convert-nifti: --split-axis '",
        a,
        "' is not x, y or z (NIfTI voxel axes i, j, k)");
    MT_CHECK(
        spec.val_fraction > 0 && spec.val_fraction < 1,
        "convert-nifti: --val-fraction ",
        spec.val_fraction,
        " is not in (0, 1)");
  }
  MT_CHECK(
      spec.resample_mm >= 0 && std::isfinite(spec.resample_mm),
      "convert-nifti: --resample ",
      spec.resample_mm,
      " must be a positive voxel size in mm (finite, > 0)");
  MT_CHECK(
      spec.chunk > 0, "convert-nifti: --chunk ", spec.chunk, " must be > 0");
  std::vector<LabelRule> rules;
  if (!spec.label_map.empty())
    rules = parse_label_map(spec.label_map);
  std::vector<std::string> names;
  if (!spec.class_names.empty()) {
    names = split_list(spec.class_names);
    for (const auto& n : names)
      MT_CHECK(
          !n.empty(),
          "convert-nifti: --class-names '",
          spec.class_names,
          "' has an empty name");
  }

  if (!spec.analyze_orientation.empty())
    check_axis_code("convert-nifti", spec.analyze_orientation);
  Nifti img = open_header(
      "convert-nifti", "--image", spec.image, spec.analyze_orientation);
  Nifti lbl = open_header(
      "convert-nifti", "--labels", spec.labels, spec.analyze_orientation);
  MT_CHECK(
      spec.analyze_orientation.empty() || img.analyze || lbl.analyze,
      "convert-nifti: --analyze-orientation ",
      spec.analyze_orientation,
      " is given but neither ",
      img.name(),
      " nor ",
      lbl.name(),
      " is an Analyze 7.5 file (both have the NIfTI magic and their own "
      "transforms); drop the option");
  check_same_grid(img, lbl, spec.check_affine);
  if (spec.resample_mm > 0) {
    // The output grid, before any voxel is read.
    std::ostringstream what;
    what << "--resample " << spec.resample_mm;
    resampled_dims_within_memory(
        "convert-nifti",
        what.str(),
        {img.nz, img.ny, img.nx},
        {img.pix_mm[2], img.pix_mm[1], img.pix_mm[0]},
        {spec.resample_mm, spec.resample_mm, spec.resample_mm},
        img.nt,
        "use a larger --resample");
  }
  load_data(img);
  std::vector<float> image = read_image(img);
  img.im.reset();
  load_data(lbl);
  std::vector<uint8_t> mask = read_labels(lbl, rules);
  lbl.im.reset();

  Common cm;
  cm.chunk = spec.chunk;
  cm.label_map = spec.label_map;
  cm.resample_mm = spec.resample_mm;
  cm.source = "image=" + spec.image + "; labels=" + spec.labels;
  int64_t max_class = 1;
  if (!rules.empty()) {
    for (const auto& r : rules)
      max_class = std::max<int64_t>(max_class, r.cls);
  } else {
    for (uint8_t v : mask)
      max_class = std::max<int64_t>(max_class, v);
  }
  cm.num_classes = max_class + 1;
  if (!names.empty()) {
    MT_CHECK(
        static_cast<int64_t>(names.size()) >= cm.num_classes,
        "convert-nifti: --class-names '",
        spec.class_names,
        "' names ",
        names.size(),
        " classes but the labels",
        rules.empty() ? "" : " (after --label-map)",
        " have ",
        cm.num_classes,
        " (0..",
        max_class,
        ")");
    MT_CHECK(
        names.size() <= 256,
        "convert-nifti: --class-names: at most 256 classes (uint8 masks)");
    cm.num_classes = static_cast<int64_t>(names.size());
    for (size_t i = 0; i < names.size(); ++i)
      cm.class_names += (i ? "," : "") + names[i];
  }

  // NIfTI (x, y, z, t) = memtrain (W, H, D, C): same memory order.
  Grid g{img.nt, img.nz, img.ny, img.nx};
  std::array<double, 3> pix = {img.pix_mm[2], img.pix_mm[1], img.pix_mm[0]};
  if (spec.resample_mm > 0) {
    resample(&image, &mask, &g, pix, spec.resample_mm);
    cm.spacing = {spec.resample_mm, spec.resample_mm, spec.resample_mm};
  } else {
    cm.spacing = pix;
  }

  std::vector<Part> parts;
  if (split_axis == 0) {
    Part p;
    p.path = spec.out;
    p.split = "all";
    p.grid = g;
    p.image = std::move(image);
    p.mask = std::move(mask);
    parts.push_back(std::move(p));
  } else {
    const int64_t n = split_axis == 1 ? g.d : split_axis == 2 ? g.h : g.w;
    const int64_t nval =
        static_cast<int64_t>(std::llround(spec.val_fraction * n));
    const int64_t ntrain = n - nval;
    MT_CHECK(
        nval > 0 && ntrain > 0,
        "convert-nifti: --val-fraction ",
        spec.val_fraction,
        " along --split-axis ",
        spec.split_axis,
        " (",
        n,
        " planes) gives ",
        ntrain,
        " training and ",
        nval,
        " validation planes; both must be > 0");
    const std::string base = h5::path_stem(spec.out);
    const std::string axis = spec.split_axis;
    const std::string of = " of " + std::to_string(n);
    Part t, v;
    t.path = base + "-train.h5";
    t.split = "train";
    t.slab_desc = axis + " planes [0, " + std::to_string(ntrain) + ")" + of;
    v.path = base + "-val.h5";
    v.split = "val";
    v.slab_desc = axis + " planes [" + std::to_string(ntrain) + ", " +
                  std::to_string(n) + ")" + of;
    Grid unused;
    t.image = slab(image, g, g.c, split_axis, 0, ntrain, &t.grid);
    v.image = slab(image, g, g.c, split_axis, ntrain, n, &v.grid);
    t.mask = slab(mask, g, 1, split_axis, 0, ntrain, &unused);
    v.mask = slab(mask, g, 1, split_axis, ntrain, n, &unused);
    t.grid.c = v.grid.c = g.c;
    image.clear();
    mask.clear();
    parts.push_back(std::move(t));
    parts.push_back(std::move(v));
  }

  // z-score over the non-zero voxels of the (training) image: the reader
  // computes x = raw * scale + shift.
  const IntensityNorm norm = nonzero_zscore(parts[0].image);
  cm.scale = norm.scale;
  cm.shift = norm.shift;

  TempFiles temps;
  std::vector<ConvertedFile> result;
  for (const Part& p : parts) {
    for (const ConvertedFile& r : result)
      MT_CHECK(
          r.path != p.path,
          "convert-nifti: --out '",
          spec.out,
          "' gives the same path twice");
    remove_stale_temp_files(p.path);
    const std::string tmp = temp_path_for(p.path);
    temps.paths.push_back(tmp);
    write_part(p, cm, tmp);
    ConvertedFile r;
    r.path = p.path;
    r.split = p.split;
    r.shape = {1, p.grid.c, p.grid.d, p.grid.h, p.grid.w};
    r.spacing_mm = cm.spacing;
    r.num_classes = cm.num_classes;
    r.class_voxels.assign(cm.num_classes, 0);
    for (uint8_t v : p.mask)
      ++r.class_voxels[v];
    r.class_names = names;
    result.push_back(std::move(r));
  }
  for (size_t i = 0; i < parts.size(); ++i)
    temps.publish(i, parts[i].path, "convert-nifti");
  return result;
}

}  // namespace memtrain
