#include "memtrain/data/h5/h5_dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <numeric>

#include "data/h5/h5_dataset_impl.h"
#include "data/h5/h5_read.h"
#include "data/h5/h5_util.h"
#include "data/h5/h5_volume_rows.h"
#include "data/h5/layout.h"
#include "memtrain/util/error.h"

namespace memtrain {

const char* to_string(SampleKind kind) {
  switch (kind) {
    case SampleKind::kFeatures:
      return "features";
    case SampleKind::kImages:
      return "images";
    case SampleKind::kVolumes:
      return "volumes";
  }
  return "?";
}

std::string hdf5_library_version() {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  return std::to_string(major) + "." + std::to_string(minor) + "." +
         std::to_string(release);
}

std::string DatasetInfo::context_dataset() const {
  return layout::path(
      !paired  ? layout::kContextFeatures
      : tokens ? layout::kTokens
               : layout::kFeaturesB);
}

int64_t DatasetInfo::sample_numel() const {
  return std::accumulate(
      sample_shape.begin(),
      sample_shape.end(),
      int64_t{1},
      std::multiplies<int64_t>());
}

int64_t DatasetInfo::voxels() const {
  if (kind != SampleKind::kVolumes)
    return 0;
  return sample_shape.at(1) * sample_shape.at(2) * sample_shape.at(3);
}

H5Dataset::H5Dataset(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
H5Dataset::H5Dataset(H5Dataset&&) noexcept = default;
H5Dataset& H5Dataset::operator=(H5Dataset&&) noexcept = default;
H5Dataset::~H5Dataset() = default;

H5Dataset H5Dataset::open(
    const std::string& path,
    const std::string& role,
    const OpenOptions& options) {
  h5::silence_errors();
  const std::string where = role + ": '" + path + "'";
  struct stat st {};
  MT_CHECK(
      ::stat(path.c_str(), &st) == 0,
      where,
      ": no such file (check the path, or make one with `memtrain "
      "make-data --kind features --out ",
      path,
      "`)");
  MT_CHECK(S_ISREG(st.st_mode), where, ": not a regular file");

  auto impl = std::make_unique<Impl>();
  // A chunk cache large enough for random row access across a batch: one
  // sample's row touches one chunk, and a batch touches up to batch-size
  // chunks (DESIGN.md: the 1 MiB default is too small).
  h5::Handle fapl = h5::plist(H5Pcreate(H5P_FILE_ACCESS));
  impl->file = h5::open_file(path, where, fapl.get());
  const hid_t f = impl->file.get();

  DatasetInfo info;
  info.path = path;
  int64_t version = 1;
  if (h5::read_attr(f, layout::kLayoutVersion, &version)) {
    MT_CHECK(
        version == layout::kVersion,
        where,
        ": attribute ",
        layout::kLayoutVersion,
        "=",
        version,
        " is not supported (this memtrain reads version ",
        layout::kVersion,
        ")");
  }
  // A pair file (docs/data-format.md "Pairs"): /features_a or /images is tower
  // a's input, /features_b or /tokens tower b's; /pair_ids replaces /labels.
  const bool paired =
      h5::has_link(f, layout::kFeaturesB) || h5::has_link(f, layout::kTokens);
  const bool has_features =
      h5::has_link(f, paired ? layout::kFeaturesA : layout::kFeatures);
  const bool has_images = h5::has_link(f, layout::kImages);
  const bool has_volumes = h5::has_link(f, layout::kVolumes);
  MT_CHECK(
      has_features || has_images || has_volumes,
      where,
      paired ? ": has /features_b or /tokens but no /features_a or /images "
               "for the pairs' first element (see docs/data-format.md, Pairs)"
             : ": has no /features, /images or /volumes dataset (see "
               "docs/data-format.md)");
  MT_CHECK(
      !paired || !has_volumes,
      where,
      ": has /features_b or /tokens and /volumes; pairs are rows of "
      "/features_a or /images with /features_b or /tokens");
  MT_CHECK(
      int(has_features) + int(has_images) + int(has_volumes) == 1,
      where,
      ": has more than one of /features, /images, /volumes; a file holds "
      "one kind");
  if (has_volumes) {
    open_volumes(*impl, info, where, options);
    impl->note_datasets(info);
    H5Dataset out(std::move(impl));
    out.info_ = std::move(info);
    return out;
  }
  info.kind = has_features ? SampleKind::kFeatures : SampleKind::kImages;
  info.sample_dataset = layout::path(
      !has_features ? layout::kImages
      : paired      ? layout::kFeaturesA
                    : layout::kFeatures);
  info.paired = paired;
  const std::string ds_where = where + " dataset '" + info.sample_dataset + "'";

  h5::Handle dapl = h5::plist(H5Pcreate(H5P_DATASET_ACCESS));
  H5Pset_chunk_cache(dapl.get(), 12421, 64u << 20, 1.0);
  impl->samples =
      h5::dataset(H5Dopen2(f, info.sample_dataset.c_str() + 1, dapl.get()));
  MT_CHECK(
      impl->samples.valid(),
      ds_where,
      ": cannot open (not a dataset?): ",
      h5::last_error());
  h5::check_declared_size(impl->samples.get(), ds_where);
  const auto dims = h5::dims_of(impl->samples.get());
  info.sample_dtype = h5::type_name(impl->samples.get());
  const size_t want_rank = has_features ? 2 : 4;
  const char* want_shape = has_features ? "[N, F]" : "[N, C, H, W]";
  MT_CHECK(
      dims.size() == want_rank,
      ds_where,
      ": expected ",
      want_rank,
      "-D ",
      want_shape,
      ", found ",
      dims.size(),
      "-D ",
      h5::shape_text(dims));
  if (has_features) {
    MT_CHECK(
        h5::is_float(impl->samples.get()),
        ds_where,
        ": expected float32 or float64 values, found ",
        info.sample_dtype);
  } else {
    MT_CHECK(
        h5::is_float(impl->samples.get()) || info.sample_dtype == "uint8" ||
            info.sample_dtype == "int16" || info.sample_dtype == "uint16",
        ds_where,
        ": expected float32, float64, uint8, int16 or uint16 values, "
        "found ",
        info.sample_dtype);
  }
  info.num_samples = static_cast<int64_t>(dims[0]);
  MT_CHECK(info.num_samples > 0, ds_where, ": is empty (0 samples)");
  for (size_t i = 1; i < dims.size(); ++i) {
    MT_CHECK(
        dims[i] > 0,
        ds_where,
        ": has an empty dimension ",
        h5::shape_text(dims));
    info.sample_shape.push_back(static_cast<int64_t>(dims[i]));
  }
  impl->normalise = h5::is_integer(impl->samples.get());
  if (impl->normalise) {
    // Integer images: x = raw * scale + shift; default maps uint8 to [0, 1].
    impl->scale = info.sample_dtype == "uint8" ? 1.0 / 255.0 : 1.0;
    h5::read_attr(impl->samples.get(), layout::kScale, &impl->scale);
    h5::read_attr(impl->samples.get(), layout::kShift, &impl->shift);
  }

  if (paired) {
    open_pairs(*impl, info, where);
    impl->note_datasets(info);
    H5Dataset out(std::move(impl));
    out.info_ = std::move(info);
    return out;
  }
  if (h5::has_link(f, layout::kTargets)) {
    open_targets(*impl, info, where);
  } else {
    const std::string lbl_where = where + " dataset '/labels'";
    MT_CHECK(
        h5::has_link(f, layout::kLabels),
        lbl_where,
        ": missing; every sample needs an integer class label");
    impl->labels = h5::dataset(H5Dopen2(f, layout::kLabels, H5P_DEFAULT));
    MT_CHECK(
        impl->labels.valid(), lbl_where, ": cannot open: ", h5::last_error());
    h5::check_declared_size(impl->labels.get(), lbl_where);
    h5::check_fits_memory(impl->labels.get(), lbl_where);
    const auto ldims = h5::dims_of(impl->labels.get());
    MT_CHECK(
        ldims.size() == 1,
        lbl_where,
        ": expected 1-D [N], found ",
        ldims.size(),
        "-D ",
        h5::shape_text(ldims));
    MT_CHECK(
        h5::is_integer(impl->labels.get()),
        lbl_where,
        ": expected integer labels, found ",
        h5::type_name(impl->labels.get()));
    MT_CHECK(
        static_cast<int64_t>(ldims[0]) == info.num_samples,
        lbl_where,
        ": has ",
        ldims[0],
        " labels but '",
        info.sample_dataset,
        "' has ",
        info.num_samples,
        " samples; they must be equal");

    // Labels are small (8 bytes a sample): read them all once to check them.
    std::vector<int64_t> labels(info.num_samples);
    h5::read_all(impl->labels.get(), H5T_NATIVE_INT64, labels.data());
    const auto [lo, hi] = std::minmax_element(labels.begin(), labels.end());
    MT_CHECK(
        *lo >= 0,
        lbl_where,
        ": label ",
        *lo,
        " at index ",
        lo - labels.begin(),
        " is negative; classes are 0..C-1");
    int64_t num_classes = 0;
    if (h5::read_attr(f, layout::kNumClasses, &num_classes)) {
      MT_CHECK(
          num_classes > 0,
          where,
          ": attribute num_classes=",
          num_classes,
          " must be positive");
      MT_CHECK(
          *hi < num_classes,
          lbl_where,
          ": label ",
          *hi,
          " at index ",
          hi - labels.begin(),
          " is outside 0..",
          num_classes - 1,
          " (the file's num_classes attribute is ",
          num_classes,
          ")");
    } else {
      num_classes = *hi + 1;
    }
    info.num_classes = num_classes;
    info.label_counts.assign(num_classes, 0);
    for (int64_t v : labels)
      ++info.label_counts[v];
    info.row_labels = std::move(labels);
    std::string names;
    if (h5::read_attr(f, layout::kClassNames, &names)) {
      info.class_names = h5::split_names(names);
    }
  }
  if (has_features && h5::has_link(f, layout::kContextFeatures)) {
    info.context_features = open_row_table(
        impl->context,
        f,
        layout::kContextFeatures,
        where,
        info,
        "F2",
        "they must be equal",
        dapl.get());
  }
  open_volume_rows(f, info, where);  // /volume_ids, /voxel_index
  impl->note_datasets(info);

  H5Dataset out(std::move(impl));
  out.info_ = std::move(info);
  return out;
}

int64_t open_row_table(
    h5::Handle& into,
    hid_t f,
    const char* name,
    const std::string& where,
    const DatasetInfo& info,
    const char* width,
    const char* why,
    hid_t dapl,
    bool integers) {
  const std::string w = where + " dataset '/" + name + "'";
  into = h5::dataset(H5Dopen2(f, name, dapl));
  MT_CHECK(into.valid(), w, ": cannot open: ", h5::last_error());
  h5::check_declared_size(into.get(), w);
  const auto dims = h5::dims_of(into.get());
  MT_CHECK(
      dims.size() == 2 && dims[1] > 0,
      w,
      ": expected 2-D [N, ",
      width,
      "] with ",
      width,
      " > 0, found ",
      h5::shape_text(dims));
  MT_CHECK(
      static_cast<int64_t>(dims[0]) == info.num_samples,
      w,
      ": has ",
      dims[0],
      " rows but '",
      info.sample_dataset,
      "' has ",
      info.num_samples,
      "; ",
      why);
  if (integers)  // /tokens: check_tokens (h5_pairs.cpp) checks the type
    return static_cast<int64_t>(dims[1]);
  MT_CHECK(
      h5::is_float(into.get()),
      w,
      ": expected float32 or float64 values, found ",
      h5::type_name(into.get()));
  return static_cast<int64_t>(dims[1]);
}

void H5Dataset::open_targets(
    Impl& impl, DatasetInfo& info, const std::string& where) {
  const hid_t f = impl.file.get();
  MT_CHECK(
      !h5::has_link(f, layout::kLabels),
      where,
      ": has /targets and /labels; a file holds class labels or regression "
      "targets, not both (docs/data-format.md, Targets)");
  info.targets = open_row_table(
      impl.targets,
      f,
      layout::kTargets,
      where,
      info,
      "T",
      "they must be equal");
  info.num_classes = 0;
}

void H5Dataset::read(
    const std::vector<int64_t>& indices,
    float* x,
    int64_t* y,
    float* context,
    float* targets) const {
  if (indices.empty())
    return;
  // Read each distinct row once, in file order, then scatter to the order
  // asked for.
  std::vector<int64_t> rows(indices);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  MT_INTERNAL_ASSERT(
      rows.front() >= 0 && rows.back() < info_.num_samples,
      "sample index out of range");
  MT_INTERNAL_ASSERT(
      !info_.ragged, "read() of a ragged volume file: use read_volume()");
  const int64_t numel = info_.sample_numel();
  const int64_t lnumel =
      info_.kind == SampleKind::kVolumes ? info_.voxels() : 1;
  const int64_t cnumel = info_.context_features;
  const int64_t tnumel = info_.targets;
  const size_t n = rows.size();
  const bool want_context = context && cnumel > 0;
  const bool want_targets = targets && tnumel > 0;
  const bool want_labels = y != nullptr;
  // Indices already ascending and distinct: read straight into the
  // caller's buffers; otherwise into scratch rows, then scatter.
  const char* noun = info_.kind == SampleKind::kVolumes ? "volumes" : "rows";
  const auto read_into = [&](float* xs, int64_t* ys, float* cs, float* ts) {
    h5::read_rows(impl_->samples.get(), rows, H5T_NATIVE_FLOAT, xs, noun);
    if (want_labels && impl_->labels.valid()) {
      h5::read_rows(impl_->labels.get(), rows, H5T_NATIVE_INT64, ys, noun);
    } else if (want_labels) {  // pairs without /pair_ids: a row, a pair
      std::copy(rows.begin(), rows.end(), ys);
    }
    if (want_context)
      h5::read_rows(impl_->context.get(), rows, H5T_NATIVE_FLOAT, cs, noun);
    if (want_targets)
      h5::read_rows(impl_->targets.get(), rows, H5T_NATIVE_FLOAT, ts, noun);
    impl_->apply_normalisation(xs, static_cast<int64_t>(n) * numel);
  };
  if (rows == indices) {
    read_into(x, y, context, targets);
    return;
  }
  std::vector<float> buf(n * numel);
  std::vector<int64_t> lbuf(want_labels ? n * lnumel : 0);
  std::vector<float> cbuf(want_context ? n * cnumel : 0);
  std::vector<float> tbuf(want_targets ? n * tnumel : 0);
  read_into(buf.data(), lbuf.data(), cbuf.data(), tbuf.data());
  for (size_t k = 0; k < indices.size(); ++k) {
    const size_t r =
        std::lower_bound(rows.begin(), rows.end(), indices[k]) - rows.begin();
    std::copy_n(buf.data() + r * numel, numel, x + k * numel);
    if (want_labels)
      std::copy_n(lbuf.data() + r * lnumel, lnumel, y + k * lnumel);
    if (want_context)
      std::copy_n(cbuf.data() + r * cnumel, cnumel, context + k * cnumel);
    if (want_targets)
      std::copy_n(tbuf.data() + r * tnumel, tnumel, targets + k * tnumel);
  }
}

}  // namespace memtrain
