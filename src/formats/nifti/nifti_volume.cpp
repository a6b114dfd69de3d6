#include "memtrain/formats/nifti/nifti_volume.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "formats/nifti/nifti_read.h"
#include "memtrain/util/error.h"
#include "memtrain/util/host_memory.h"
#include "memtrain/util/temp_path.h"

namespace memtrain {

NiftiCase read_nifti_case(
    const std::string& command,
    const std::string& flag,
    const std::vector<std::string>& paths,
    const std::string& analyze_orientation) {
  MT_INTERNAL_ASSERT(!paths.empty(), "a case of no file");
  nifti::Nifti n =
      nifti::open_header(command, flag, paths[0], analyze_orientation);
  nifti::load_data(n);
  NiftiCase c;
  c.path = paths[0];
  c.shape = {n.nt, n.nz, n.ny, n.nx};
  c.spacing_mm = {n.pix_mm[2], n.pix_mm[1], n.pix_mm[0]};
  c.affine = nifti::best_affine(n);
  c.voxels = nifti::read_image(n);
  for (size_t i = 1; i < paths.size(); ++i) {
    nifti::Nifti more =
        nifti::open_header(command, flag, paths[i], analyze_orientation);
    MT_CHECK(
        more.nx == n.nx && more.ny == n.ny && more.nz == n.nz &&
            nifti::same_transform(n, more),
        command,
        ": ",
        more.name(),
        " is not on the grid of ",
        n.name(),
        " (",
        more.grid(),
        " vs ",
        n.grid(),
        ", or another voxel-to-world transform); the channel files of a "
        "case must share one grid");
    nifti::load_data(more);
    const std::vector<float> v = nifti::read_image(more);
    c.voxels.insert(c.voxels.end(), v.begin(), v.end());
    c.shape[0] += more.nt;
  }
  return c;
}

NiftiCase read_nifti_case(
    const std::string& command,
    const std::string& flag,
    const std::string& path,
    const std::string& analyze_orientation) {
  return read_nifti_case(
      command, flag, std::vector<std::string>{path}, analyze_orientation);
}

std::vector<uint8_t> read_nifti_case_labels(
    const std::string& command,
    const std::string& flag,
    const std::string& path,
    const std::string& image_path,
    const std::string& label_map,
    int64_t num_classes,
    const std::string& analyze_orientation) {
  const nifti::Nifti img =
      nifti::open_header(command, "--input", image_path, analyze_orientation);
  nifti::Nifti lbl =
      nifti::open_header(command, flag, path, analyze_orientation);
  nifti::check_same_grid(img, lbl, /*check_affine=*/true);
  nifti::load_data(lbl);
  return nifti::read_labels(
      lbl,
      label_map.empty() ? std::vector<LabelRule>{} : parse_label_map(label_map),
      {num_classes,
       "the model's " + std::to_string(num_classes) + " classes",
       " (map them to the model's classes with --label-map)"});
}

void write_nifti_labels_like(
    const std::string& reference,
    const std::vector<uint8_t>& labels,
    const std::string& out,
    const std::string& analyze_orientation) {
  const nifti::Nifti ref =
      nifti::open_header("predict", "--input", reference, analyze_orientation);
  MT_INTERNAL_ASSERT(labels.size() == ref.voxels3d());
  nifti::NiftiPtr im(nifti_copy_nim_info(ref.im.get()));
  MT_CHECK(
      im != nullptr, "predict: cannot copy the header of '", reference, "'");
  im->ndim = im->dim[0] = 3;
  im->nt = im->nu = im->nv = im->nw = 1;
  for (int d = 4; d <= 7; ++d)
    im->dim[d] = 1;
  im->nvox = labels.size();
  im->datatype = DT_UINT8;
  im->nbyper = 1;
  im->swapsize = 0;
  im->scl_slope = 0;  // none: the values are the classes
  im->scl_inter = 0;
  im->cal_min = 0;
  im->cal_max =
      labels.empty() ? 0 : *std::max_element(labels.begin(), labels.end());
  im->intent_code = NIFTI_INTENT_LABEL;
  im->nifti_type = NIFTI_FTYPE_NIFTI1_1;
  im->num_ext = 0;
  im->ext_list = nullptr;
  if (ref.analyze) {
    // Its transform is the one --analyze-orientation gave: written as
    // the sform (aligned), so that the output declares it.
    const Affine a = nifti::best_affine(ref);
    im->sform_code = NIFTI_XFORM_ALIGNED_ANAT;
    im->qform_code = NIFTI_XFORM_UNKNOWN;
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 4; ++c)
        im->sto_xyz.m[r][c] = a[r * 4 + c];
    im->sto_ijk = nifti_dmat44_inverse(im->sto_xyz);
    im->xyz_units = NIFTI_UNITS_MM;
  }
  im->data = std::malloc(labels.size());
  MT_CHECK(im->data != nullptr, "predict: out of host memory for '", out, "'");
  std::memcpy(im->data, labels.data(), labels.size());

  // A temporary name with the same extension, in the same folder.
  const std::filesystem::path target(out);
  const std::string name = target.filename().string();
  const bool gz = name.size() > 7 && name.substr(name.size() - 7) == ".nii.gz";
  MT_CHECK(
      gz || (name.size() > 4 && name.substr(name.size() - 4) == ".nii"),
      "predict: output '",
      out,
      "' must end in .nii or .nii.gz");
  remove_stale_temp_files(out);
  const std::string tmp = (target.parent_path() /
                           (".tmp" + std::to_string(::getpid()) + "-" + name))
                              .string();
  MT_CHECK(
      nifti_set_filenames(im.get(), tmp.c_str(), 0, 1) == 0,
      "predict: cannot name the output file '",
      tmp,
      "'");
  // nifti_image_write reports no failure: a full disk leaves a short file
  // (or a gzip stream cut off). The file is read back and compared before
  // it is published; errno after the write holds the OS's reason.
  errno = 0;
  nifti_image_write(im.get());
  const int write_errno = errno;
  std::error_code ec;
  bool whole = false;
  {
    nifti::NiftiPtr back(nifti_image_read(tmp.c_str(), 1));
    whole = back && back->data &&
            static_cast<size_t>(back->nvox) == labels.size() &&
            back->nbyper == 1 &&
            std::memcmp(back->data, labels.data(), labels.size()) == 0;
  }
  if (!whole) {
    std::filesystem::remove(tmp, ec);
    std::string why = write_errno != 0 ? std::strerror(write_errno)
                                       : "it does not read back whole";
    struct statvfs st {};
    if (::statvfs(
            target.parent_path().empty() ? "." : target.parent_path().c_str(),
            &st) == 0)
      why += " (" +
             std::to_string(static_cast<uint64_t>(st.f_bavail) * st.f_frsize) +
             " bytes free on its file system)";
    throw Error(
        "predict: cannot write '" + out + "' (as '" + tmp +
        "', now removed): " + why);
  }
  std::filesystem::rename(tmp, target, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw Error("predict: cannot move the output into place as '" + out + "'");
  }
}

std::array<int64_t, 3> resampled_dims(
    const std::array<int64_t, 3>& dims,
    const std::array<double, 3>& spacing,
    const std::array<double, 3>& target) {
  std::array<int64_t, 3> m{};
  for (int a = 0; a < 3; ++a) {
    m[a] = std::max<int64_t>(
        1,
        static_cast<int64_t>(std::llround(dims[a] * spacing[a] / target[a])));
  }
  return m;
}

std::array<int64_t, 3> resampled_dims_within_memory(
    const std::string& command,
    const std::string& what,
    const std::array<int64_t, 3>& dims,
    const std::array<double, 3>& spacing,
    const std::array<double, 3>& target,
    int64_t channels,
    const std::string& remedy) {
  double m[3], in = 1, out = 1;
  for (int a = 0; a < 3; ++a) {
    MT_INTERNAL_ASSERT(
        spacing[a] > 0 && target[a] > 0 && std::isfinite(target[a]),
        "unchecked spacing");
    m[a] = std::max(
        1.0, std::round(static_cast<double>(dims[a]) * spacing[a] / target[a]));
    in *= static_cast<double>(dims[a]);
    out *= m[a];
  }
  const double per_voxel = 4.0 * static_cast<double>(channels) + 1.0;
  const double need = (in + out) * per_voxel;
  const double avail = static_cast<double>(available_host_memory());
  const bool fits = m[0] < 1e15 && m[1] < 1e15 && m[2] < 1e15 && out < 9e15 &&
                    (avail <= 0 || need <= avail);
  if (!fits) {
    // Whole numbers below 1e15, else 3 significant digits (1.84e+08).
    auto num = [](double v, int decimals) {
      std::ostringstream o;
      if (v < 1e15)
        o << std::fixed << std::setprecision(decimals) << v;
      else
        o << std::setprecision(3) << v;
      return o.str();
    };
    std::string grid;
    for (int a = 2; a >= 0; --a)
      grid += num(m[a], 0) + (a > 0 ? "x" : "");
    const double gib = 1024.0 * 1024 * 1024;
    throw Error(
        command + ": " + what + " makes a " + grid +
        " grid (x, y, z: " + num(out, 0) + " voxels, " +
        num(out * per_voxel / gib, 2) + " GiB as float32" +
        (channels > 1 ? " x " + std::to_string(channels) + " channels" : "") +
        " + labels) but this machine has " + num(avail / gib, 2) +
        " GiB available (MemAvailable); " + remedy);
  }
  return {
      static_cast<int64_t>(m[0]),
      static_cast<int64_t>(m[1]),
      static_cast<int64_t>(m[2])};
}

std::vector<float> resample_linear(
    const std::vector<float>& src,
    int64_t channels,
    const std::array<int64_t, 3>& dims,
    const std::array<double, 3>& from,
    const std::array<int64_t, 3>& to_dims,
    const std::array<double, 3>& to) {
  const int64_t H = dims[1], W = dims[2];
  const size_t in_plane = static_cast<size_t>(dims[0] * H * W);
  MT_INTERNAL_ASSERT(src.size() == in_plane * channels);
  nifti::AxisMap maps[3];
  for (int a = 0; a < 3; ++a)
    maps[a] = nifti::axis_map(dims[a], from[a], to[a], to_dims[a]);
  const nifti::AxisMap &md = maps[0], &mh = maps[1], &mw = maps[2];
  const size_t out_plane =
      static_cast<size_t>(to_dims[0] * to_dims[1] * to_dims[2]);
  std::vector<float> out(out_plane * channels);
  float* dst = out.data();
  for (int64_t c = 0; c < channels; ++c) {
    const float* s = src.data() + c * in_plane;
    for (int64_t z = 0; z < to_dims[0]; ++z) {
      const float wz = md.w[z];
      const float* s0 = s + md.i0[z] * H * W;
      const float* s1 = s + md.i1[z] * H * W;
      for (int64_t y = 0; y < to_dims[1]; ++y) {
        const float wy = mh.w[y];
        const int64_t r0 = mh.i0[y] * W, r1 = mh.i1[y] * W;
        for (int64_t x = 0; x < to_dims[2]; ++x) {
          const float wx = mw.w[x];
          const int64_t c0 = mw.i0[x], c1 = mw.i1[x];
          auto lerp_row = [&](const float* p, int64_t r) {
            return p[r + c0] * (1 - wx) + p[r + c1] * wx;
          };
          const float a0 = lerp_row(s0, r0) * (1 - wy) + lerp_row(s0, r1) * wy;
          const float a1 = lerp_row(s1, r0) * (1 - wy) + lerp_row(s1, r1) * wy;
          *dst++ = a0 * (1 - wz) + a1 * wz;
        }
      }
    }
  }
  return out;
}

namespace {
IntensityNorm zscore_of(const float* voxels, size_t size) {
  double sum = 0, sq = 0;
  int64_t count = 0;
  for (size_t i = 0; i < size; ++i) {
    const float x = voxels[i];
    if (x != 0) {
      sum += x;
      sq += static_cast<double>(x) * x;
      ++count;
    }
  }
  IntensityNorm n;
  if (count > 0) {
    const double mean = sum / count;
    const double var = std::max(0.0, sq / count - mean * mean);
    const double sd = std::sqrt(var);
    n.scale = sd > 0 ? 1.0 / sd : 1.0;
    n.shift = -mean * n.scale;
  }
  return n;
}
}  // namespace

IntensityNorm nonzero_zscore(const std::vector<float>& voxels) {
  return zscore_of(voxels.data(), voxels.size());
}

std::vector<IntensityNorm> normalize_channels(
    std::vector<float>* voxels, int64_t channels) {
  MT_INTERNAL_ASSERT(
      channels > 0 && voxels->size() % static_cast<size_t>(channels) == 0);
  const size_t plane = voxels->size() / static_cast<size_t>(channels);
  std::vector<IntensityNorm> norms;
  for (int64_t c = 0; c < channels; ++c) {
    float* p = voxels->data() + static_cast<size_t>(c) * plane;
    const IntensityNorm n = zscore_of(p, plane);
    for (size_t i = 0; i < plane; ++i)
      p[i] = static_cast<float>(p[i] * n.scale + n.shift);
    norms.push_back(n);
  }
  return norms;
}

}  // namespace memtrain
