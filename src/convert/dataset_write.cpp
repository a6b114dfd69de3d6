// memtrain convert-dataset: each case's voxels read, reoriented to RAS,
// resampled, normalised, and written into its box of the ragged files
// (docs/data-format.md "Cases of different shapes").

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "convert/dataset_case.h"
#include "data/h5/h5_util.h"
#include "data/h5/layout.h"
#include "formats/nifti/nifti_read.h"
#include "memtrain/formats/nifti/nifti_volume.h"
#include "memtrain/util/error.h"
#include "memtrain/util/temp_path.h"
#include "util/temp_files.h"

namespace memtrain {
namespace {

constexpr const char* kCmd = "convert-dataset";
// deflate level: 1 writes fast; the z-scored background and the partly
// filled edge chunks compress about as well as at higher levels.
constexpr unsigned kDeflate = 1;

std::string who(const DatasetCase& c, const char* what) {
  return "case " + c.name + " " + what;
}

// A chunked dataset with gzip and Fletcher32 whose chunks are allocated
// only when written (HDF5's default for chunked layouts).
h5::Handle create_chunked(
    hid_t f,
    const char* name,
    hid_t file_type,
    const std::vector<hsize_t>& dims,
    const std::vector<hsize_t>& chunk) {
  h5::Handle sp = h5::space(
      H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  h5::Handle dcpl = h5::plist(H5Pcreate(H5P_DATASET_CREATE));
  MT_CHECK(
      H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()) >=
              0 &&
          H5Pset_deflate(dcpl.get(), kDeflate) >= 0 &&
          H5Pset_fletcher32(dcpl.get()) >= 0 &&
          H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_INCR) >= 0,
      kCmd,
      ": cannot set the chunks and filters of '",
      name,
      "': ",
      h5::last_error());
  h5::Handle ds = h5::dataset(H5Dcreate2(
      f, name, file_type, sp.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
  MT_CHECK(
      ds.valid(),
      kCmd,
      ": cannot create dataset '",
      name,
      "': ",
      h5::last_error());
  return ds;
}

// Writes `data` (`count` of `mem_type`) at `start` of `ds`.
void write_box(
    hid_t ds,
    hid_t mem_type,
    const std::vector<hsize_t>& start,
    const std::vector<hsize_t>& count,
    const void* data) {
  h5::Handle fs = h5::space(H5Dget_space(ds));
  h5::Handle ms = h5::space(
      H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr));
  if (H5Sselect_hyperslab(
          fs.get(),
          H5S_SELECT_SET,
          start.data(),
          nullptr,
          count.data(),
          nullptr) >= 0 &&
      H5Dwrite(ds, mem_type, ms.get(), fs.get(), H5P_DEFAULT, data) >= 0)
    return;
  // Before any other HDF5 call: each clears HDF5's error stack.
  const std::string why = h5::write_reason(ds);
  throw Error(detail::concat(
      kCmd,
      ": cannot write to '",
      h5::object_name(ds),
      "' in '",
      h5::file_name(ds),
      "': ",
      why));
}

void write_doubles(hid_t f, const char* name, const std::vector<double>& v) {
  const hsize_t n = v.size();
  h5::Handle sp = h5::space(H5Screate_simple(1, &n, nullptr));
  h5::Handle a = h5::attribute(
      H5Acreate2(f, name, H5T_IEEE_F64LE, sp.get(), H5P_DEFAULT, H5P_DEFAULT));
  MT_CHECK(
      a.valid() && H5Awrite(a.get(), H5T_NATIVE_DOUBLE, v.data()) >= 0,
      kCmd,
      ": cannot write attribute '",
      name,
      "': ",
      h5::last_error());
}

// One case's RAS voxels on the target grid: [C, d, h, w] and [d, h, w].
void read_case(
    const DatasetCase& c,
    const DatasetWriteCommon& cm,
    std::vector<float>* image,
    std::vector<uint8_t>* mask) {
  image->clear();
  for (const std::string& f : c.images) {
    nifti::Nifti n =
        nifti::open_header(kCmd, who(c, "image"), f, cm.analyze_orientation);
    nifti::load_data(n);
    const std::vector<float> v = nifti::read_image(n);
    image->insert(image->end(), v.begin(), v.end());
  }
  nifti::Nifti l = nifti::open_header(
      kCmd, who(c, "label"), c.label, cm.analyze_orientation);
  nifti::load_data(l);
  *mask = nifti::read_labels(
      l, {}, {cm.num_classes, "dataset.json's labels", "", /*map_flag=*/""});
  *image = reorient(*image, cm.channels, c.source_shape, c.orientation);
  *mask = reorient(*mask, 1, c.source_shape, c.orientation);
  bool same = true;
  for (int a = 0; a < 3; ++a)
    same =
        same && c.out_shape[a] == c.ras_shape_dhw[a] &&
        std::fabs(c.ras_spacing_dhw[a] - cm.spacing[a]) <= 1e-6 * cm.spacing[a];
  if (!same) {
    *image = resample_linear(
        *image,
        cm.channels,
        c.ras_shape_dhw,
        c.ras_spacing_dhw,
        c.out_shape,
        cm.spacing);
    *mask = nifti::resample_nearest(
        *mask, c.ras_shape_dhw, c.ras_spacing_dhw, c.out_shape, cm.spacing);
  }
  normalize_channels(image, cm.channels);
}

DatasetFile write_file(
    const std::string& path,
    const std::string& tmp,
    const std::string& split,
    const std::vector<DatasetCase>& cases,
    const std::vector<size_t>& rows,
    const DatasetWriteCommon& cm) {
  DatasetFile r;
  r.path = path;
  r.split = split;
  r.cases = static_cast<int64_t>(rows.size());
  r.channels = cm.channels;
  size_t name_len = 1;
  for (size_t i : rows) {
    for (int a = 0; a < 3; ++a)
      r.max_shape[a] = std::max(r.max_shape[a], cases[i].out_shape[a]);
    r.case_names.push_back(cases[i].name);
    name_len = std::max(name_len, cases[i].name.size());
  }
  h5::Handle file = h5::create_file(tmp, std::string(kCmd) + ": --out");
  const hid_t f = file.get();
  const hsize_t n = rows.size(), c = static_cast<hsize_t>(cm.channels);
  std::vector<hsize_t> box(3), ck(3);
  for (int a = 0; a < 3; ++a) {
    box[a] = static_cast<hsize_t>(r.max_shape[a]);
    ck[a] = std::min<hsize_t>(static_cast<hsize_t>(cm.chunk), box[a]);
  }
  h5::Handle vol = create_chunked(
      f,
      layout::kVolumes,
      H5T_IEEE_F32LE,
      {n, c, box[0], box[1], box[2]},
      {1, c, ck[0], ck[1], ck[2]});
  h5::Handle msk = create_chunked(
      f,
      layout::kMasks,
      H5T_STD_U8LE,
      {n, box[0], box[1], box[2]},
      {1, ck[0], ck[1], ck[2]});
  h5::write_attr(vol.get(), layout::kScale, 1.0);
  h5::write_attr(vol.get(), layout::kShift, 0.0);
  std::vector<int64_t> shapes, source_shapes;
  std::vector<double> affines, source_affines;
  std::vector<float> image;
  std::vector<uint8_t> mask;
  for (size_t row = 0; row < rows.size(); ++row) {
    const DatasetCase& dc = cases[rows[row]];
    read_case(dc, cm, &image, &mask);
    const std::array<int64_t, 3>& s = dc.out_shape;
    const hsize_t d = s[0], h = s[1], w = s[2];
    write_box(
        vol.get(),
        H5T_NATIVE_FLOAT,
        {row, 0, 0, 0, 0},
        {1, c, d, h, w},
        image.data());
    write_box(
        msk.get(), H5T_NATIVE_UINT8, {row, 0, 0, 0}, {1, d, h, w}, mask.data());
    shapes.insert(shapes.end(), s.begin(), s.end());
    source_shapes.insert(
        source_shapes.end(), dc.source_shape.begin(), dc.source_shape.end());
    // The stored grid: reoriented, then resampled (i, j, k order).
    const std::array<int64_t, 3> ras =
        reoriented_shape(dc.orientation, dc.source_shape);
    const std::array<double, 3> from = {
        dc.ras_spacing_dhw[2], dc.ras_spacing_dhw[1], dc.ras_spacing_dhw[0]};
    const Affine a = resampled_affine(
        reoriented_affine(dc.orientation, dc.source_affine, dc.source_shape),
        ras,
        from,
        {s[2], s[1], s[0]},
        {cm.spacing[2], cm.spacing[1], cm.spacing[0]});
    affines.insert(affines.end(), a.begin(), a.end());
    source_affines.insert(
        source_affines.end(), dc.source_affine.begin(), dc.source_affine.end());
  }
  vol.reset();
  msk.reset();
  h5::write_dataset(
      f,
      layout::kVolumeShapes,
      H5T_STD_I64LE,
      H5T_NATIVE_INT64,
      {n, 3},
      {},
      shapes.data());
  h5::write_dataset(
      f,
      layout::kCaseSourceShape,
      H5T_STD_I64LE,
      H5T_NATIVE_INT64,
      {n, 3},
      {},
      source_shapes.data());
  h5::write_dataset(
      f,
      layout::kCaseAffine,
      H5T_IEEE_F64LE,
      H5T_NATIVE_DOUBLE,
      {n, 4, 4},
      {},
      affines.data());
  h5::write_dataset(
      f,
      layout::kCaseSourceAffine,
      H5T_IEEE_F64LE,
      H5T_NATIVE_DOUBLE,
      {n, 4, 4},
      {},
      source_affines.data());
  {
    std::vector<char> names(n * name_len, '\0');
    for (size_t i = 0; i < n; ++i)
      std::memcpy(
          names.data() + i * name_len,
          r.case_names[i].data(),
          r.case_names[i].size());
    h5::Handle t = h5::type(H5Tcopy(H5T_C_S1));
    H5Tset_size(t.get(), name_len);
    H5Tset_strpad(t.get(), H5T_STR_NULLPAD);
    h5::write_dataset(
        f, layout::kCaseNames, t.get(), t.get(), {n}, {}, names.data());
  }
  h5::write_attr(f, layout::kLayoutVersion, layout::kVersion);
  h5::write_attr(f, layout::kKind, std::string("volumes"));
  h5::write_attr(f, layout::kNumClasses, cm.num_classes);
  h5::write_attr(f, layout::kClassNames, cm.class_names);
  write_doubles(f, layout::kSpacingMm, {cm.spacing.begin(), cm.spacing.end()});
  h5::write_attr(f, layout::kOrientation, std::string("RAS"));
  h5::write_attr(f, layout::kSource, cm.source);
  h5::write_attr(
      f, layout::kGenerator, std::string("memtrain convert-dataset"));
  h5::write_attr(f, layout::kSplit, split);
  h5::write_attr(f, layout::kSeed, static_cast<int64_t>(cm.seed));
  if (cm.val_fraction >= 0)
    h5::write_attr(f, layout::kValFraction, cm.val_fraction);
  else
    h5::write_attr(f, layout::kFold, cm.fold);
  vol.reset();
  msk.reset();
  h5::finish_file(&file, kCmd);
  return r;
}

}  // namespace

void read_case_header(
    DatasetCase* c, int64_t channels, const std::string& analyze_orientation) {
  const nifti::Nifti lbl =
      nifti::open_header(kCmd, who(*c, "label"), c->label, analyze_orientation);
  c->analyze = lbl.analyze;
  for (size_t i = 0; i < c->images.size(); ++i) {
    const nifti::Nifti img = nifti::open_header(
        kCmd, who(*c, "image"), c->images[i], analyze_orientation);
    c->analyze = c->analyze || img.analyze;
    const int64_t want = c->single_file ? channels : 1;
    MT_CHECK(
        img.nt == want,
        kCmd,
        ": ",
        img.name(),
        ": has ",
        img.nt,
        " volume(s) (4th dimension) but ",
        c->single_file
            ? "dataset.json has " + std::to_string(channels) + " channel(s)"
            : std::string("a channel file must be 3D"));
    nifti::check_same_grid(
        img,
        lbl,
        /*check_affine=*/true,
        "fix the headers (image and label must be on one grid in the world)");
    for (double p : img.pix_mm)
      MT_CHECK(
          p > 0 && std::isfinite(p),
          kCmd,
          ": ",
          img.name(),
          ": voxel sizes (pixdim) must be > 0, got ",
          img.im->dx,
          ",",
          img.im->dy,
          ",",
          img.im->dz);
    if (i > 0)
      continue;
    c->source_shape = {img.nx, img.ny, img.nz};
    c->source_affine = nifti::best_affine(img);
    try {
      c->orientation = io_orientation(c->source_affine);
    } catch (const Error& e) {
      throw Error(std::string(kCmd) + ": " + img.name() + ": " + e.what());
    }
    const std::array<int64_t, 3> s =
        reoriented_shape(c->orientation, c->source_shape);
    const std::array<double, 3> p =
        reoriented_spacing(c->orientation, img.pix_mm);
    c->ras_shape_dhw = {s[2], s[1], s[0]};
    c->ras_spacing_dhw = {p[2], p[1], p[0]};
  }
}

std::vector<DatasetFile> write_dataset_files(
    const std::string& out,
    const std::vector<DatasetCase>& cases,
    const std::vector<size_t>& train,
    const std::vector<size_t>& val,
    const DatasetWriteCommon& common) {
  h5::silence_errors();
  const std::string base = h5::path_stem(out);
  const std::string paths[2] = {base + "-train.h5", base + "-val.h5"};
  TempFiles temps;
  std::vector<DatasetFile> files;
  for (int s = 0; s < 2; ++s) {
    remove_stale_temp_files(paths[s]);
    const std::string tmp = temp_path_for(paths[s]);
    temps.paths.push_back(tmp);
    files.push_back(write_file(
        paths[s],
        tmp,
        s == 0 ? "train" : "val",
        cases,
        s == 0 ? train : val,
        common));
  }
  for (int s = 0; s < 2; ++s)
    temps.publish(s, paths[s], kCmd);
  return files;
}

}  // namespace memtrain
