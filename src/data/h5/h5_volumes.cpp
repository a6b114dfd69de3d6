// Volume files (docs/data-format.md, "Volumes" and "Cases of different
// shapes"): opening /volumes and /masks, the cases' own shapes, whole-case
// and patch reads. Split from h5_dataset.cpp, which opens every layout.
#include <algorithm>

#include "data/h5/h5_dataset_impl.h"
#include "data/h5/h5_read.h"
#include "data/h5/h5_util.h"
#include "data/h5/layout.h"
#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

constexpr size_t kMaxForeground = 65536;

// /volume_shapes and /case_names (docs/data-format.md, "Cases of different
// shapes"): each case's (d, h, w) inside the array's [D, H, W], checked.
void open_case_shapes(hid_t f, DatasetInfo& info, const std::string& where) {
  const int64_t n = info.num_samples;
  const std::array<int64_t, 3> full = {
      info.sample_shape[1], info.sample_shape[2], info.sample_shape[3]};
  info.volume_shapes.assign(n, full);
  if (h5::has_link(f, layout::kVolumeShapes)) {
    const std::string sw = where + " dataset '/volume_shapes'";
    h5::Handle ds =
        h5::dataset(H5Dopen2(f, layout::kVolumeShapes, H5P_DEFAULT));
    MT_CHECK(ds.valid(), sw, ": cannot open: ", h5::last_error());
    h5::check_declared_size(ds.get(), sw);
    h5::check_fits_memory(ds.get(), sw);
    const auto dims = h5::dims_of(ds.get());
    const std::vector<hsize_t> want = {hsize_t(n), 3};
    MT_CHECK(
        dims == want && h5::is_integer(ds.get()),
        sw,
        ": expected [",
        n,
        ", 3] integers (each case's d, h, w), found ",
        h5::type_name(ds.get()),
        " ",
        h5::shape_text(dims));
    std::vector<int64_t> raw(n * 3);
    h5::read_all(ds.get(), H5T_NATIVE_INT64, raw.data());
    for (int64_t v = 0; v < n; ++v) {
      for (int a = 0; a < 3; ++a) {
        const int64_t e = raw[v * 3 + a];
        MT_CHECK(
            e >= 1 && e <= full[a],
            sw,
            ": case ",
            v,
            " has extent ",
            e,
            " on axis ",
            "DHW"[a],
            ", outside 1..",
            full[a],
            " (the /volumes array's)");
        info.volume_shapes[v][a] = e;
      }
      info.ragged = info.ragged || info.volume_shapes[v] != full;
    }
  }
  if (h5::has_link(f, layout::kCaseNames)) {
    h5::Handle ds = h5::dataset(H5Dopen2(f, layout::kCaseNames, H5P_DEFAULT));
    MT_CHECK(
        ds.valid(),
        where,
        " dataset '/case_names': cannot open: ",
        h5::last_error());
    info.case_names = h5::read_strings(ds.get());
    MT_CHECK(
        static_cast<int64_t>(info.case_names.size()) == n,
        where,
        " dataset '/case_names': ",
        info.case_names.size(),
        " names for ",
        n,
        " volumes");
  }
}

}  // namespace

const std::array<int64_t, 3>& DatasetInfo::volume_shape(int64_t v) const {
  MT_INTERNAL_ASSERT(
      kind == SampleKind::kVolumes && v >= 0 &&
          v < static_cast<int64_t>(volume_shapes.size()),
      "volume_shape(): not a volume index");
  return volume_shapes[v];
}

int64_t DatasetInfo::volume_voxels(int64_t v) const {
  const auto& s = volume_shape(v);
  return s[0] * s[1] * s[2];
}

std::string DatasetInfo::volume_name(int64_t v) const {
  std::string s = "volume " + std::to_string(v);
  if (v >= 0 && v < static_cast<int64_t>(case_names.size()) &&
      !case_names[v].empty())
    s += " (" + case_names[v] + ")";
  return s;
}

void H5Dataset::open_volumes(
    Impl& impl,
    DatasetInfo& info,
    const std::string& where,
    const OpenOptions& options) {
  const hid_t f = impl.file.get();
  info.kind = SampleKind::kVolumes;
  info.sample_dataset = layout::path(layout::kVolumes);
  const std::string vw = where + " dataset '/volumes'";
  // Patches touch a few chunks of every channel; a cache of 64 MiB holds
  // the chunks of several 96^3 float32 patches (DESIGN.md: HDF5's default
  // of 1 MiB does not hold one).
  h5::Handle dapl = h5::plist(H5Pcreate(H5P_DATASET_ACCESS));
  H5Pset_chunk_cache(dapl.get(), 12421, 64u << 20, 1.0);
  impl.samples = h5::dataset(H5Dopen2(f, layout::kVolumes, dapl.get()));
  MT_CHECK(
      impl.samples.valid(),
      vw,
      ": cannot open (not a dataset?): ",
      h5::last_error());
  h5::check_declared_size(impl.samples.get(), vw);
  const auto dims = h5::dims_of(impl.samples.get());
  info.sample_dtype = h5::type_name(impl.samples.get());
  MT_CHECK(
      dims.size() == 5,
      vw,
      ": expected 5-D [N, C, D, H, W], found ",
      dims.size(),
      "-D ",
      h5::shape_text(dims));
  MT_CHECK(
      info.sample_dtype == "float32" || info.sample_dtype == "float64" ||
          info.sample_dtype == "uint8" || info.sample_dtype == "int16" ||
          info.sample_dtype == "uint16",
      vw,
      ": expected float32, uint8, int16 or uint16 values, found ",
      info.sample_dtype);
  for (size_t i = 0; i < dims.size(); ++i) {
    MT_CHECK(
        dims[i] > 0, vw, ": has an empty dimension ", h5::shape_text(dims));
  }
  info.num_samples = static_cast<int64_t>(dims[0]);
  for (size_t i = 1; i < 5; ++i)
    info.sample_shape.push_back(static_cast<int64_t>(dims[i]));
  {
    h5::Handle dcpl = h5::plist(H5Dget_create_plist(impl.samples.get()));
    if (H5Pget_layout(dcpl.get()) == H5D_CHUNKED) {
      hsize_t chunk[5] = {0, 0, 0, 0, 0};
      H5Pget_chunk(dcpl.get(), 5, chunk);
      for (int i = 1; i < 5; ++i)
        info.chunk_shape.push_back(static_cast<int64_t>(chunk[i]));
    }
  }
  // Intensity: config, else the attributes, else uint8 to [0, 1].
  if (options.intensity_scale != 0.0) {
    impl.scale = options.intensity_scale;
    impl.shift = options.intensity_shift;
  } else {
    impl.scale = info.sample_dtype == "uint8" ? 1.0 / 255.0 : 1.0;
    impl.shift = 0.0;
    h5::read_attr(impl.samples.get(), layout::kScale, &impl.scale);
    h5::read_attr(impl.samples.get(), layout::kShift, &impl.shift);
  }
  impl.normalise = impl.scale != 1.0 || impl.shift != 0.0;
  info.scale = impl.scale;
  info.shift = impl.shift;
  {
    h5::Handle attr =
        h5::attribute(H5Aopen(f, layout::kSpacingMm, H5P_DEFAULT));
    if (attr.valid()) {
      h5::Handle sp = h5::space(H5Aget_space(attr.get()));
      if (H5Sget_simple_extent_npoints(sp.get()) == 3) {
        H5Aread(attr.get(), H5T_NATIVE_DOUBLE, info.spacing_mm.data());
      }
    }
  }
  h5::read_attr(f, layout::kOrientation, &info.orientation);  // "" when absent

  const std::string mw = where + " dataset '/masks'";
  MT_CHECK(
      !h5::has_link(f, layout::kLabels),
      where,
      ": has /volumes with /labels; a volume file labels every voxel with "
      "/masks [N, D, H, W] (see docs/data-format.md)");
  MT_CHECK(
      h5::has_link(f, layout::kMasks),
      mw,
      ": missing; /volumes needs /masks [N, D, H, W], the class of every "
      "voxel");
  impl.labels = h5::dataset(H5Dopen2(f, layout::kMasks, dapl.get()));
  MT_CHECK(impl.labels.valid(), mw, ": cannot open: ", h5::last_error());
  h5::check_declared_size(impl.labels.get(), mw);
  const auto mdims = h5::dims_of(impl.labels.get());
  const std::vector<hsize_t> want = {dims[0], dims[2], dims[3], dims[4]};
  MT_CHECK(
      mdims == want,
      mw,
      ": shape ",
      h5::shape_text(mdims),
      " does not match /volumes ",
      h5::shape_text(dims),
      "; expected ",
      h5::shape_text(want),
      " (one label per voxel, no channel axis)");
  MT_CHECK(
      h5::is_integer(impl.labels.get()),
      mw,
      ": expected integer labels, found ",
      h5::type_name(impl.labels.get()));
  int64_t num_classes = 0;
  const bool have_classes = h5::read_attr(f, layout::kNumClasses, &num_classes);
  if (have_classes) {
    MT_CHECK(
        num_classes > 0,
        where,
        ": attribute num_classes=",
        num_classes,
        " must be positive");
  }

  open_case_shapes(f, info, where);

  // Masks are read once, a slab of planes at a time, each case's own
  // extent only: checked, counted, and their foreground voxels indexed for
  // data.pos_fraction.
  std::vector<int64_t> buf;
  std::vector<int64_t> counts;
  int64_t max_label = 0;
  impl.foreground.resize(info.num_samples);
  for (int64_t v = 0; v < info.num_samples; ++v) {
    const auto& ext = info.volume_shapes[v];
    const int64_t D = ext[0];
    const int64_t plane = ext[1] * ext[2];
    const int64_t slab = std::max<int64_t>(1, (4 << 20) / plane);
    std::vector<int64_t>& fg = impl.foreground[v];
    int64_t stride = 1;
    int64_t seen = 0;  // foreground voxels so far
    for (int64_t z = 0; z < D; z += slab) {
      const int64_t nz = std::min(slab, D - z);
      buf.resize(nz * plane);
      h5::read_box(
          impl.labels.get(),
          {hsize_t(v), hsize_t(z), 0, 0},
          {1, hsize_t(nz), hsize_t(ext[1]), hsize_t(ext[2])},
          H5T_NATIVE_INT64,
          buf.data());
      for (int64_t i = 0; i < nz * plane; ++i) {
        const int64_t l = buf[i];
        if (l < 0 || (have_classes && l >= num_classes)) {
          const int64_t at = z * plane + i;
          throw Error(detail::concat(
              mw,
              ": label ",
              l,
              " at ",
              info.volume_name(v),
              ", voxel [",
              at / plane,
              ",",
              (at % plane) / ext[2],
              ",",
              at % ext[2],
              "] is outside 0..",
              have_classes ? num_classes - 1 : 0,
              have_classes ? " (the file's num_classes attribute)"
                           : " (labels are never negative)"));
        }
        max_label = std::max(max_label, l);
        if (l >= static_cast<int64_t>(counts.size()))
          counts.resize(l + 1, 0);
        ++counts[l];
        if (l > 0) {
          if (seen % stride == 0)
            fg.push_back(z * plane + i);
          ++seen;
          if (fg.size() >= 2 * kMaxForeground) {
            // Keep every other one: the subset stays evenly strided.
            std::vector<int64_t> half;
            half.reserve(kMaxForeground);
            for (size_t k = 0; k < fg.size(); k += 2)
              half.push_back(fg[k]);
            fg.swap(half);
            stride *= 2;
          }
        }
      }
    }
  }
  info.num_classes = have_classes ? num_classes : max_label + 1;
  counts.resize(std::max<int64_t>(info.num_classes, counts.size()), 0);
  info.label_counts = counts;
  std::string names;
  if (h5::read_attr(f, layout::kClassNames, &names))
    info.class_names = h5::split_names(names);
}

const std::vector<int64_t>& H5Dataset::foreground(int64_t v) const {
  MT_INTERNAL_ASSERT(
      info_.kind == SampleKind::kVolumes && v >= 0 &&
          v < static_cast<int64_t>(impl_->foreground.size()),
      "foreground(): not a volume index");
  return impl_->foreground[v];
}

void H5Dataset::read_volume(int64_t v, float* x, int64_t* y) const {
  MT_INTERNAL_ASSERT(info_.kind == SampleKind::kVolumes, "not volumes");
  const auto& e = info_.volume_shape(v);
  const int64_t c = info_.sample_shape[0];
  h5::read_box(
      impl_->samples.get(),
      {hsize_t(v), 0, 0, 0, 0},
      {1, hsize_t(c), hsize_t(e[0]), hsize_t(e[1]), hsize_t(e[2])},
      H5T_NATIVE_FLOAT,
      x);
  h5::read_box(
      impl_->labels.get(),
      {hsize_t(v), 0, 0, 0},
      {1, hsize_t(e[0]), hsize_t(e[1]), hsize_t(e[2])},
      H5T_NATIVE_INT64,
      y);
  impl_->apply_normalisation(x, c * e[0] * e[1] * e[2]);
}

void H5Dataset::read_patch(
    int64_t v,
    const std::array<int64_t, 3>& corner,
    const std::array<int64_t, 3>& size,
    float* x,
    int64_t* y) const {
  MT_INTERNAL_ASSERT(info_.kind == SampleKind::kVolumes, "not volumes");
  const int64_t c = info_.sample_shape[0];
  const auto& e = info_.volume_shape(v);
  // The part of the patch inside the case: [lo, hi) on each axis.
  std::array<int64_t, 3> lo{}, hi{};
  bool inside = true;
  for (int i = 0; i < 3; ++i) {
    MT_INTERNAL_ASSERT(size[i] > 0, "empty patch");
    lo[i] = std::max<int64_t>(corner[i], 0);
    hi[i] = std::min<int64_t>(corner[i] + size[i], e[i]);
    MT_INTERNAL_ASSERT(lo[i] < hi[i], "patch outside the case");
    inside = inside && lo[i] == corner[i] && hi[i] == corner[i] + size[i];
  }
  const int64_t voxels = size[0] * size[1] * size[2];
  if (inside) {
    h5::read_box(
        impl_->samples.get(),
        {hsize_t(v), 0, hsize_t(lo[0]), hsize_t(lo[1]), hsize_t(lo[2])},
        {1, hsize_t(c), hsize_t(size[0]), hsize_t(size[1]), hsize_t(size[2])},
        H5T_NATIVE_FLOAT,
        x);
    if (y != nullptr) {
      h5::read_box(
          impl_->labels.get(),
          {hsize_t(v), hsize_t(lo[0]), hsize_t(lo[1]), hsize_t(lo[2])},
          {1, hsize_t(size[0]), hsize_t(size[1]), hsize_t(size[2])},
          H5T_NATIVE_INT64,
          y);
    }
    impl_->apply_normalisation(x, c * voxels);
    return;
  }
  // A case smaller than the patch (or a corner outside it): read the part
  // inside, normalise it, and place it in a patch of image 0, label 0.
  const std::array<int64_t, 3> n = {
      hi[0] - lo[0], hi[1] - lo[1], hi[2] - lo[2]};
  const int64_t part = n[0] * n[1] * n[2];
  std::vector<float> xs(c * part);
  std::vector<int64_t> ys(y != nullptr ? part : 0);
  h5::read_box(
      impl_->samples.get(),
      {hsize_t(v), 0, hsize_t(lo[0]), hsize_t(lo[1]), hsize_t(lo[2])},
      {1, hsize_t(c), hsize_t(n[0]), hsize_t(n[1]), hsize_t(n[2])},
      H5T_NATIVE_FLOAT,
      xs.data());
  if (y != nullptr) {
    h5::read_box(
        impl_->labels.get(),
        {hsize_t(v), hsize_t(lo[0]), hsize_t(lo[1]), hsize_t(lo[2])},
        {1, hsize_t(n[0]), hsize_t(n[1]), hsize_t(n[2])},
        H5T_NATIVE_INT64,
        ys.data());
    std::fill_n(y, voxels, int64_t{0});
  }
  impl_->apply_normalisation(xs.data(), c * part);
  std::fill_n(x, c * voxels, 0.0f);
  const std::array<int64_t, 3> off = {
      lo[0] - corner[0], lo[1] - corner[1], lo[2] - corner[2]};
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t z = 0; z < n[0]; ++z) {
      for (int64_t r = 0; r < n[1]; ++r) {
        const int64_t src = (z * n[1] + r) * n[2];
        const int64_t dst =
            ((off[0] + z) * size[1] + off[1] + r) * size[2] + off[2];
        std::copy_n(xs.data() + ch * part + src, n[2], x + ch * voxels + dst);
        if (ch == 0 && y != nullptr)
          std::copy_n(ys.data() + src, n[2], y + dst);
      }
    }
  }
}

}  // namespace memtrain
