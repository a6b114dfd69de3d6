#include "memtrain/data/h5_dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <numeric>

#include "h5_util.h"
#include "memtrain/util/error.h"

namespace memtrain {

const char* to_string(SampleKind kind) {
  return kind == SampleKind::kFeatures ? "features" : "images";
}

std::string hdf5_library_version() {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  return std::to_string(major) + "." + std::to_string(minor) + "." +
         std::to_string(release);
}

int64_t DatasetInfo::sample_numel() const {
  return std::accumulate(
      sample_shape.begin(),
      sample_shape.end(),
      int64_t{1},
      std::multiplies<int64_t>());
}

struct H5Dataset::Impl {
  h5::Handle file;
  h5::Handle samples;
  h5::Handle labels;
  // x = raw * scale + shift, for integer-typed sample datasets.
  bool integer_samples = false;
  double scale = 1.0;
  double shift = 0.0;
};

H5Dataset::H5Dataset(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
H5Dataset::H5Dataset(H5Dataset&&) noexcept = default;
H5Dataset& H5Dataset::operator=(H5Dataset&&) noexcept = default;
H5Dataset::~H5Dataset() = default;

namespace {

std::string shape_text(const std::vector<hsize_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    s += (i ? "," : "") + std::to_string(dims[i]);
  }
  return s + "]";
}

std::vector<std::string> split_names(const std::string& joined) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= joined.size() && !joined.empty()) {
    const size_t end = joined.find(',', start);
    out.push_back(joined.substr(start, end - start));
    if (end == std::string::npos)
      break;
    start = end + 1;
  }
  return out;
}

}  // namespace

H5Dataset H5Dataset::open(const std::string& path, const std::string& role) {
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
  MT_CHECK(
      H5Fis_hdf5(path.c_str()) > 0,
      where,
      ": not an HDF5 file (memtrain reads the HDF5 layout of "
      "data/FORMAT.md; `memtrain inspect FILE` checks a file)");

  auto impl = std::make_unique<Impl>();
  // A chunk cache large enough for random row access across a batch: one
  // sample's row touches one chunk, and a batch touches up to batch-size
  // chunks (DESIGN.md: the 1 MiB default is too small).
  h5::Handle fapl = h5::plist(H5Pcreate(H5P_FILE_ACCESS));
  impl->file = h5::file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()));
  MT_CHECK(impl->file.valid(), where, ": cannot open: ", h5::last_error());
  const hid_t f = impl->file.get();

  DatasetInfo info;
  info.path = path;
  int64_t version = 1;
  if (h5::read_attr(f, "layout_version", &version)) {
    MT_CHECK(
        version == 1,
        where,
        ": attribute layout_version=",
        version,
        " is not supported (this memtrain reads version 1)");
  }
  const bool has_features = h5::has_link(f, "features");
  const bool has_images = h5::has_link(f, "images");
  MT_CHECK(
      has_features || has_images,
      where,
      ": has neither a /features nor an /images dataset (see "
      "data/FORMAT.md)");
  MT_CHECK(
      !(has_features && has_images),
      where,
      ": has both /features and /images; a file holds one kind");
  info.kind = has_features ? SampleKind::kFeatures : SampleKind::kImages;
  info.sample_dataset = has_features ? "/features" : "/images";
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
      shape_text(dims));
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
        dims[i] > 0, ds_where, ": has an empty dimension ", shape_text(dims));
    info.sample_shape.push_back(static_cast<int64_t>(dims[i]));
  }
  impl->integer_samples = h5::is_integer(impl->samples.get());
  if (impl->integer_samples) {
    // Integer images: x = raw * scale + shift; default maps uint8 to [0, 1].
    impl->scale = info.sample_dtype == "uint8" ? 1.0 / 255.0 : 1.0;
    h5::read_attr(impl->samples.get(), "scale", &impl->scale);
    h5::read_attr(impl->samples.get(), "shift", &impl->shift);
  }

  const std::string lbl_where = where + " dataset '/labels'";
  MT_CHECK(
      h5::has_link(f, "labels"),
      lbl_where,
      ": missing; every sample needs an integer class label");
  impl->labels = h5::dataset(H5Dopen2(f, "labels", H5P_DEFAULT));
  MT_CHECK(
      impl->labels.valid(), lbl_where, ": cannot open: ", h5::last_error());
  const auto ldims = h5::dims_of(impl->labels.get());
  MT_CHECK(
      ldims.size() == 1,
      lbl_where,
      ": expected 1-D [N], found ",
      ldims.size(),
      "-D ",
      shape_text(ldims));
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
  MT_CHECK(
      H5Dread(
          impl->labels.get(),
          H5T_NATIVE_INT64,
          H5S_ALL,
          H5S_ALL,
          H5P_DEFAULT,
          labels.data()) >= 0,
      lbl_where,
      ": cannot read: ",
      h5::last_error());
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
  if (h5::read_attr(f, "num_classes", &num_classes)) {
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
  std::string names;
  if (h5::read_attr(f, "class_names", &names)) {
    info.class_names = split_names(names);
  }

  H5Dataset out(std::move(impl));
  out.info_ = std::move(info);
  return out;
}

void H5Dataset::read(
    const std::vector<int64_t>& indices, float* x, int64_t* y) const {
  if (indices.empty())
    return;
  const int64_t n_total = info_.num_samples;
  // Read each distinct row once, in file order, then scatter to the order
  // asked for.
  std::vector<int64_t> rows(indices);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  MT_INTERNAL_ASSERT(
      rows.front() >= 0 && rows.back() < n_total, "sample index out of range");

  const int64_t numel = info_.sample_numel();
  const int rank = static_cast<int>(info_.sample_shape.size()) + 1;
  h5::Handle fspace = h5::space(H5Dget_space(impl_->samples.get()));
  h5::Handle lspace = h5::space(H5Dget_space(impl_->labels.get()));
  H5Sselect_none(fspace.get());
  H5Sselect_none(lspace.get());
  // Select runs of consecutive rows as one block each.
  for (size_t i = 0; i < rows.size();) {
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1)
      ++j;
    std::vector<hsize_t> start(rank, 0), count(rank, 1), block(rank, 1);
    start[0] = static_cast<hsize_t>(rows[i]);
    block[0] = static_cast<hsize_t>(j - i);
    for (int d = 1; d < rank; ++d) {
      block[d] = static_cast<hsize_t>(info_.sample_shape[d - 1]);
    }
    H5Sselect_hyperslab(
        fspace.get(),
        H5S_SELECT_OR,
        start.data(),
        nullptr,
        count.data(),
        block.data());
    H5Sselect_hyperslab(
        lspace.get(),
        H5S_SELECT_OR,
        start.data(),
        nullptr,
        count.data(),
        block.data());
    i = j;
  }
  const hsize_t n = rows.size();
  const hsize_t flat = n * static_cast<hsize_t>(numel);
  h5::Handle mspace = h5::space(H5Screate_simple(1, &flat, nullptr));
  h5::Handle mlspace = h5::space(H5Screate_simple(1, &n, nullptr));
  std::vector<float> buf(flat);
  std::vector<int64_t> lbuf(n);
  const std::string where = "'" + info_.path + "' dataset '";
  MT_CHECK(
      H5Dread(
          impl_->samples.get(),
          H5T_NATIVE_FLOAT,
          mspace.get(),
          fspace.get(),
          H5P_DEFAULT,
          buf.data()) >= 0,
      "cannot read ",
      where,
      info_.sample_dataset,
      "': ",
      h5::last_error());
  MT_CHECK(
      H5Dread(
          impl_->labels.get(),
          H5T_NATIVE_INT64,
          mlspace.get(),
          lspace.get(),
          H5P_DEFAULT,
          lbuf.data()) >= 0,
      "cannot read ",
      where,
      "/labels': ",
      h5::last_error());
  if (impl_->integer_samples) {
    const float scale = static_cast<float>(impl_->scale);
    const float shift = static_cast<float>(impl_->shift);
    for (float& v : buf)
      v = v * scale + shift;
  }
  for (size_t k = 0; k < indices.size(); ++k) {
    const size_t r =
        std::lower_bound(rows.begin(), rows.end(), indices[k]) - rows.begin();
    std::copy_n(buf.data() + r * numel, numel, x + k * numel);
    y[k] = lbuf[r];
  }
}

}  // namespace memtrain
