#include "memtrain/data/nifti_convert.h"

#include <nifti1_io.h>
#include <sys/stat.h>
#include <unistd.h>
#include <znzlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>

#include "h5_util.h"
#include "memtrain/util/error.h"
#include "temp_files.h"

namespace memtrain {
namespace {

constexpr const char* kSupported =
    "uint8, int8, int16, uint16, int32, uint32, int64, uint64, float32, "
    "float64";

struct NiftiFree {
  void operator()(nifti_image* p) const {
    nifti_image_free(p);
  }
};
using NiftiPtr = std::unique_ptr<nifti_image, NiftiFree>;

std::string fmt(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

bool supported_type(int dt) {
  switch (dt) {
    case DT_UINT8:
    case DT_INT8:
    case DT_INT16:
    case DT_UINT16:
    case DT_INT32:
    case DT_UINT32:
    case DT_INT64:
    case DT_UINT64:
    case DT_FLOAT32:
    case DT_FLOAT64:
      return true;
    default:
      return false;
  }
}

// Calls f(const T* data) with the voxel array of `im` as its own type.
template <typename F>
void visit(const nifti_image* im, F&& f) {
  const void* d = im->data;
  switch (im->datatype) {
    case DT_UINT8:
      return f(static_cast<const uint8_t*>(d));
    case DT_INT8:
      return f(static_cast<const int8_t*>(d));
    case DT_INT16:
      return f(static_cast<const int16_t*>(d));
    case DT_UINT16:
      return f(static_cast<const uint16_t*>(d));
    case DT_INT32:
      return f(static_cast<const int32_t*>(d));
    case DT_UINT32:
      return f(static_cast<const uint32_t*>(d));
    case DT_INT64:
      return f(static_cast<const int64_t*>(d));
    case DT_UINT64:
      return f(static_cast<const uint64_t*>(d));
    case DT_FLOAT32:
      return f(static_cast<const float*>(d));
    case DT_FLOAT64:
      return f(static_cast<const double*>(d));
    default:
      MT_INTERNAL_ASSERT(false, "unchecked NIfTI datatype ", im->datatype);
  }
}

// The 4 bytes of sizeof_hdr (gzip or not): 348 NIfTI-1, 540 NIfTI-2.
int32_t header_size(const std::string& path) {
  znzFile f = znzopen(path.c_str(), "rb", 1);
  if (znz_isnull(f))
    return -1;
  int32_t size = -1;
  if (znzread(&size, 1, 4, f) != 4)
    size = -1;
  Xznzclose(&f);
  return size;
}

int32_t bswap32(int32_t v) {
  const uint32_t u = static_cast<uint32_t>(v);
  return static_cast<int32_t>(
      (u >> 24) | ((u >> 8) & 0xff00u) | ((u << 8) & 0xff0000u) | (u << 24));
}

// What a file is, as read from its header (data not loaded yet).
struct Nifti {
  std::string flag;  // "--image" or "--labels"
  std::string path;
  NiftiPtr im;
  int64_t nx = 1, ny = 1, nz = 1, nt = 1;
  std::array<double, 3> pix_mm{1, 1, 1};  // |dx|, |dy|, |dz| in mm
  bool scaled = false;
  double slope = 1, inter = 0;

  std::string name() const {
    return flag + " '" + path + "'";
  }
  size_t voxels3d() const {
    return static_cast<size_t>(nx * ny * nz);
  }
  std::string grid() const {
    return std::to_string(nx) + "x" + std::to_string(ny) + "x" +
           std::to_string(nz);
  }
};

Nifti open_header(const std::string& flag, const std::string& path) {
  MT_CHECK(!path.empty(), "convert-nifti: ", flag, " is required");
  Nifti n;
  n.flag = flag;
  n.path = path;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw Error(
        "convert-nifti: " + n.name() + ": " +
        (errno == ENOENT ? std::string("no such file")
                         : std::string(std::strerror(errno))));
  }
  MT_CHECK(
      S_ISREG(st.st_mode), "convert-nifti: ", n.name(), ": not a regular file");
  MT_CHECK(
      ::access(path.c_str(), R_OK) == 0,
      "convert-nifti: ",
      n.name(),
      ": cannot read (",
      std::strerror(errno),
      ")");
  // NIfTI-2 first: nifti1_io would print its own error for it.
  const int32_t size = header_size(path);
  if (size == 540 || bswap32(size) == 540) {
    throw Error(
        "convert-nifti: " + n.name() +
        ": is a NIfTI-2 file; only NIfTI-1 is supported (save it as "
        "NIfTI-1, e.g. with nibabel's Nifti1Image)");
  }
  nifti_set_debug_level(0);  // the library prints its errors otherwise
  n.im.reset(nifti_image_read(path.c_str(), 0));
  if (!n.im) {
    throw Error(
        "convert-nifti: " + n.name() +
        ": not a NIfTI-1 file (no valid NIfTI-1 header)");
  }
  const nifti_image* im = n.im.get();
  if (!supported_type(im->datatype)) {
    throw Error(
        "convert-nifti: " + n.name() + ": datatype " +
        nifti_datatype_string(im->datatype) + " (code " +
        std::to_string(im->datatype) +
        ") is not supported; supported: real scalars (" + kSupported + ")");
  }
  MT_CHECK(
      im->nu <= 1 && im->nv <= 1 && im->nw <= 1,
      "convert-nifti: ",
      n.name(),
      ": has ",
      im->ndim,
      " dimensions (",
      im->nx,
      "x",
      im->ny,
      "x",
      im->nz,
      "x",
      im->nt,
      "x",
      im->nu,
      "...); at most 4 (x, y, z, volumes) are supported");
  n.nx = std::max(1, im->nx);
  n.ny = std::max(1, im->ny);
  n.nz = std::max(1, im->nz);
  n.nt = std::max(1, im->nt);
  double to_mm = 1.0;
  switch (im->xyz_units) {
    case NIFTI_UNITS_METER:
      to_mm = 1000.0;
      break;
    case NIFTI_UNITS_MICRON:
      to_mm = 0.001;
      break;
    default:  // mm or unknown: mm
      break;
  }
  n.pix_mm = {
      std::fabs(im->dx) * to_mm,
      std::fabs(im->dy) * to_mm,
      std::fabs(im->dz) * to_mm};
  n.slope = im->scl_slope;
  n.inter = im->scl_inter;
  n.scaled = std::isfinite(n.slope) && std::isfinite(n.inter) && n.slope != 0 &&
             !(n.slope == 1 && n.inter == 0);
  return n;
}

void load_data(Nifti& n) {
  MT_CHECK(
      nifti_image_load(n.im.get()) == 0 && n.im->data,
      "convert-nifti: ",
      n.name(),
      ": cannot read the voxel data (truncated or corrupt file?)");
}

// The world transforms a file declares (sform, qform), 3x4 each.
std::vector<std::array<double, 12>> transforms(const nifti_image* im) {
  std::vector<std::array<double, 12>> out;
  auto add = [&](const mat44& m) {
    std::array<double, 12> a{};
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 4; ++c)
        a[r * 4 + c] = m.m[r][c];
    out.push_back(a);
  };
  if (im->sform_code > 0)
    add(im->sto_xyz);
  if (im->qform_code > 0)
    add(im->qto_xyz);
  return out;
}

std::string transform_str(const std::array<double, 12>& a) {
  std::string s = "[";
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 4; ++c)
      s += (c ? " " : "") + fmt(std::round(a[r * 4 + c] * 1000) / 1000);
    s += r < 2 ? "; " : "]";
  }
  return s;
}

void check_same_grid(const Nifti& img, const Nifti& lbl, bool check_affine) {
  MT_CHECK(
      img.nx == lbl.nx && img.ny == lbl.ny && img.nz == lbl.nz,
      "convert-nifti: grid mismatch: ",
      img.name(),
      " is ",
      img.grid(),
      " but ",
      lbl.name(),
      " is ",
      lbl.grid(),
      "; image and labels must have the same voxel grid");
  MT_CHECK(
      lbl.nt == 1,
      "convert-nifti: ",
      lbl.name(),
      ": has ",
      lbl.nt,
      " volumes (4D); labels must be one 3D volume");
  if (!check_affine)
    return;
  const auto ti = transforms(img.im.get());
  const auto tl = transforms(lbl.im.get());
  if (ti.empty() || tl.empty())
    return;  // one of them declares no orientation: nothing to compare
  for (const auto& a : ti) {
    for (const auto& b : tl) {
      bool same = true;
      for (int e = 0; e < 12; ++e)
        same = same && std::fabs(a[e] - b[e]) <= 1e-3;
      if (same)
        return;
    }
  }
  throw Error(
      "convert-nifti: " + img.name() + " and " + lbl.name() +
      " have the same grid " + img.grid() +
      " but different voxel-to-world transforms (image " +
      transform_str(ti[0]) + ", labels " + transform_str(tl[0]) +
      "): the labels would not line up with the image; fix the headers or "
      "pass --ignore-affine if the voxels do correspond");
}

bool parse_number(const std::string& s, double* out) {
  if (s.empty())
    return false;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v))
    return false;
  *out = v;
  return true;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos)
    return "";
  const auto e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, ','))
    out.push_back(trim(cur));
  if (!s.empty() && s.back() == ',')
    out.push_back("");
  return out;
}

// Image voxels as float32 (slope applied), NIfTI order = [C, D, H, W].
std::vector<float> read_image(const Nifti& n) {
  const size_t count = n.voxels3d() * static_cast<size_t>(n.nt);
  std::vector<float> out(count);
  visit(n.im.get(), [&](const auto* p) {
    for (size_t i = 0; i < count; ++i) {
      double v = static_cast<double>(p[i]);
      if (n.scaled)
        v = v * n.slope + n.inter;
      out[i] = static_cast<float>(v);
      if (!std::isfinite(out[i])) {
        const size_t plane = static_cast<size_t>(n.nx * n.ny);
        throw Error(
            "convert-nifti: " + n.name() + ": voxel (" +
            std::to_string(i % n.nx) + "," + std::to_string((i / n.nx) % n.ny) +
            "," + std::to_string((i / plane) % n.nz) + ") is " + fmt(v) +
            " (not a finite float32); replace NaN/Inf voxels first");
      }
    }
  });
  return out;
}

// Label voxels mapped to classes (uint8), NIfTI order = [D, H, W].
std::vector<uint8_t> read_labels(
    const Nifti& n, const std::vector<LabelRule>& rules) {
  const size_t count = n.voxels3d();
  std::vector<uint8_t> out(count);
  auto where = [&](size_t i) {
    const size_t plane = static_cast<size_t>(n.nx * n.ny);
    return "(" + std::to_string(i % n.nx) + "," +
           std::to_string((i / n.nx) % n.ny) + "," + std::to_string(i / plane) +
           ")";
  };
  visit(n.im.get(), [&](const auto* p) {
    for (size_t i = 0; i < count; ++i) {
      double v = static_cast<double>(p[i]);
      if (n.scaled)
        v = v * n.slope + n.inter;
      if (!rules.empty()) {
        uint8_t c = 0;
        for (const LabelRule& r : rules) {
          if (r.matches(v)) {
            c = static_cast<uint8_t>(r.cls);
            break;
          }
        }
        out[i] = c;
        continue;
      }
      const double rv = std::round(v);
      if (!(std::fabs(v - rv) <= 1e-4 && rv >= 0)) {
        throw Error(
            "convert-nifti: " + n.name() + ": voxel " + where(i) +
            " has label " + fmt(v) +
            "; without --label-map labels must be non-negative integers "
            "(map them with --label-map)");
      }
      if (rv > 255) {
        throw Error(
            "convert-nifti: " + n.name() + ": voxel " + where(i) +
            " has label " + fmt(v) +
            "; classes are stored as uint8 (0..255): group the labels with "
            "--label-map");
      }
      out[i] = static_cast<uint8_t>(rv);
    }
  });
  return out;
}

// A volume in memtrain's axis order: [C, D, H, W], W fastest.
struct Grid {
  int64_t c = 1, d = 1, h = 1, w = 1;
  size_t plane() const {
    return static_cast<size_t>(d * h * w);
  }
};

struct AxisMap {
  std::vector<int64_t> i0, i1, nn;
  std::vector<float> w;
};

// Output voxel o of m, size `mm`, centred on the input extent of n voxels of
// size `pix`: input coordinate x = (n-1)/2 + (o - (m-1)/2) * mm / pix,
// clamped to the input (border voxels repeat).
AxisMap axis_map(int64_t n, double pix, double mm, int64_t m) {
  AxisMap a;
  a.i0.resize(m);
  a.i1.resize(m);
  a.nn.resize(m);
  a.w.resize(m);
  for (int64_t o = 0; o < m; ++o) {
    const double x = (n - 1) / 2.0 + (o - (m - 1) / 2.0) * mm / pix;
    const double xc = std::clamp(x, 0.0, static_cast<double>(n - 1));
    a.i0[o] = static_cast<int64_t>(std::floor(xc));
    a.i1[o] = std::min(a.i0[o] + 1, n - 1);
    a.w[o] = static_cast<float>(xc - a.i0[o]);
    a.nn[o] = std::clamp<int64_t>(
        static_cast<int64_t>(std::floor(x + 0.5)), 0, n - 1);
  }
  return a;
}

void resample(
    std::vector<float>* image,
    std::vector<uint8_t>* mask,
    Grid* g,
    const std::array<double, 3>& pix_dhw,
    double mm) {
  const int64_t n[3] = {g->d, g->h, g->w};
  int64_t m[3];
  AxisMap maps[3];
  for (int a = 0; a < 3; ++a) {
    m[a] = std::max<int64_t>(
        1, static_cast<int64_t>(std::llround(n[a] * pix_dhw[a] / mm)));
    maps[a] = axis_map(n[a], pix_dhw[a], mm, m[a]);
  }
  const AxisMap &md = maps[0], &mh = maps[1], &mw = maps[2];
  const size_t out_plane = static_cast<size_t>(m[0] * m[1] * m[2]);
  std::vector<float> img(out_plane * g->c);
  std::vector<uint8_t> msk(out_plane);
  const int64_t H = g->h, W = g->w;
  for (int64_t c = 0; c < g->c; ++c) {
    const float* src = image->data() + c * g->plane();
    float* dst = img.data() + c * out_plane;
    for (int64_t z = 0; z < m[0]; ++z) {
      const float wz = md.w[z];
      const float* s0 = src + md.i0[z] * H * W;
      const float* s1 = src + md.i1[z] * H * W;
      for (int64_t y = 0; y < m[1]; ++y) {
        const float wy = mh.w[y];
        const int64_t r0 = mh.i0[y] * W, r1 = mh.i1[y] * W;
        for (int64_t x = 0; x < m[2]; ++x) {
          const float wx = mw.w[x];
          const int64_t c0 = mw.i0[x], c1 = mw.i1[x];
          auto lerp_row = [&](const float* s, int64_t r) {
            return s[r + c0] * (1 - wx) + s[r + c1] * wx;
          };
          const float a0 = lerp_row(s0, r0) * (1 - wy) + lerp_row(s0, r1) * wy;
          const float a1 = lerp_row(s1, r0) * (1 - wy) + lerp_row(s1, r1) * wy;
          *dst++ = a0 * (1 - wz) + a1 * wz;
        }
      }
    }
  }
  uint8_t* dst = msk.data();
  for (int64_t z = 0; z < m[0]; ++z)
    for (int64_t y = 0; y < m[1]; ++y)
      for (int64_t x = 0; x < m[2]; ++x)
        *dst++ = (*mask)[(md.nn[z] * H + mh.nn[y]) * W + mw.nn[x]];
  image->swap(img);
  mask->swap(msk);
  g->d = m[0];
  g->h = m[1];
  g->w = m[2];
}

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
  h5::Handle file =
      h5::file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  MT_CHECK(
      file.valid(),
      "convert-nifti: --out: cannot create '",
      tmp,
      "' (does the folder exist and is it writable?): ",
      h5::last_error());
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
      "volumes",
      H5T_IEEE_F32LE,
      H5T_NATIVE_FLOAT,
      vdims,
      {1, static_cast<hsize_t>(g.c), ck(g.d), ck(g.h), ck(g.w)},
      p.image.data());
  h5::write_dataset(
      f,
      "masks",
      H5T_STD_U8LE,
      H5T_NATIVE_UINT8,
      {1, vdims[2], vdims[3], vdims[4]},
      {1, ck(g.d), ck(g.h), ck(g.w)},
      p.mask.data());
  {
    h5::Handle ds = h5::dataset(H5Dopen2(f, "volumes", H5P_DEFAULT));
    h5::write_attr(ds.get(), "scale", cm.scale);
    h5::write_attr(ds.get(), "shift", cm.shift);
  }
  h5::write_attr(f, "layout_version", int64_t{1});
  h5::write_attr(f, "kind", std::string("volumes"));
  h5::write_attr(f, "num_classes", cm.num_classes);
  if (!cm.class_names.empty())
    h5::write_attr(f, "class_names", cm.class_names);
  {
    const hsize_t three = 3;
    h5::Handle sp = h5::space(H5Screate_simple(1, &three, nullptr));
    h5::Handle a = h5::attribute(H5Acreate2(
        f, "spacing_mm", H5T_IEEE_F64LE, sp.get(), H5P_DEFAULT, H5P_DEFAULT));
    MT_CHECK(
        a.valid() &&
            H5Awrite(a.get(), H5T_NATIVE_DOUBLE, cm.spacing.data()) >= 0,
        "convert-nifti: cannot write attribute 'spacing_mm' to '",
        tmp,
        "': ",
        h5::last_error());
  }
  h5::write_attr(f, "source", cm.source);
  // Provenance, ignored by the reader.
  h5::write_attr(f, "generator", std::string("memtrain convert-nifti"));
  h5::write_attr(f, "split", p.split);
  if (!p.slab_desc.empty())
    h5::write_attr(f, "slab", p.slab_desc);
  if (!cm.label_map.empty())
    h5::write_attr(f, "label_map", cm.label_map);
  if (cm.resample_mm > 0)
    h5::write_attr(f, "resample_mm", cm.resample_mm);
  MT_CHECK(
      H5Fflush(f, H5F_SCOPE_GLOBAL) >= 0,
      "convert-nifti: cannot flush '",
      tmp,
      "': ",
      h5::last_error());
}

std::string stem(const std::string& out) {
  for (const char* ext : {".h5", ".hdf5"}) {
    const size_t n = std::strlen(ext);
    if (out.size() > n && out.compare(out.size() - n, n, ext) == 0)
      return out.substr(0, out.size() - n);
  }
  return out;
}

}  // namespace

bool LabelRule::matches(double v) const {
  switch (kind) {
    case kValue:
      return std::fabs(v - a) <= 1e-6 * std::max(1.0, std::fabs(a));
    case kRange:
      return v >= a - 1e-6 * std::max(1.0, std::fabs(a)) &&
             v <= b + 1e-6 * std::max(1.0, std::fabs(b));
    case kGreater:
      return v > a;
  }
  return false;
}

std::vector<LabelRule> parse_label_map(const std::string& text) {
  std::vector<LabelRule> rules;
  const std::string syntax =
      " (expected a comma list of RULE:CLASS, RULE = V, A-B or >V, CLASS = "
      "0..255, e.g. '>0:1' or '1-28:1,29-42:2')";
  for (const std::string& item : split_list(text)) {
    auto bad = [&](const std::string& why) {
      return Error(
          "convert-nifti: --label-map '" + text + "': rule '" + item + "' " +
          why + syntax);
    };
    const size_t colon = item.rfind(':');
    if (colon == std::string::npos)
      throw bad("has no ':CLASS'");
    const std::string lhs = trim(item.substr(0, colon));
    const std::string rhs = trim(item.substr(colon + 1));
    double cls = 0;
    if (!parse_number(rhs, &cls) || cls != std::floor(cls) || cls < 0 ||
        cls > 255)
      throw bad("has class '" + rhs + "', not an integer in 0..255");
    LabelRule r;
    r.cls = static_cast<int>(cls);
    if (!lhs.empty() && lhs[0] == '>') {
      r.kind = LabelRule::kGreater;
      if (!parse_number(trim(lhs.substr(1)), &r.a))
        throw bad("has no number after '>'");
    } else if (parse_number(lhs, &r.a)) {
      r.kind = LabelRule::kValue;
    } else {
      // A-B: the '-' after the first number (either may be negative).
      r.kind = LabelRule::kRange;
      bool ok = false;
      for (size_t dash = 1; dash < lhs.size() && !ok; ++dash) {
        if (lhs[dash] != '-')
          continue;
        ok = parse_number(trim(lhs.substr(0, dash)), &r.a) &&
             parse_number(trim(lhs.substr(dash + 1)), &r.b);
      }
      if (!ok)
        throw bad("is not V, A-B or >V");
      if (r.a > r.b)
        throw bad("has an empty range (A > B)");
    }
    rules.push_back(r);
  }
  MT_CHECK(!rules.empty(), "convert-nifti: --label-map is empty", syntax);
  return rules;
}

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
      " must be a positive voxel size in mm");
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

  Nifti img = open_header("--image", spec.image);
  Nifti lbl = open_header("--labels", spec.labels);
  check_same_grid(img, lbl, spec.check_affine);
  if (spec.resample_mm > 0) {
    for (const Nifti* n : {&img, &lbl})
      for (double p : n->pix_mm)
        MT_CHECK(
            p > 0 && std::isfinite(p),
            "convert-nifti: --resample needs voxel sizes, but ",
            n->name(),
            " has pixdim ",
            n->im->dx,
            ",",
            n->im->dy,
            ",",
            n->im->dz);
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
    const std::string base = stem(spec.out);
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
  {
    double sum = 0, sq = 0;
    int64_t count = 0;
    for (float x : parts[0].image) {
      if (x != 0) {
        sum += x;
        sq += static_cast<double>(x) * x;
        ++count;
      }
    }
    if (count > 0) {
      const double mean = sum / count;
      const double var = std::max(0.0, sq / count - mean * mean);
      const double sd = std::sqrt(var);
      cm.scale = sd > 0 ? 1.0 / sd : 1.0;
      cm.shift = -mean * cm.scale;
    }
  }

  TempFiles temps;
  std::vector<ConvertedFile> result;
  for (const Part& p : parts) {
    for (const ConvertedFile& r : result)
      MT_CHECK(
          r.path != p.path,
          "convert-nifti: --out '",
          spec.out,
          "' gives the same path twice");
    const std::string tmp = p.path + ".tmp." + std::to_string(::getpid());
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
  for (size_t i = 0; i < parts.size(); ++i) {
    if (std::rename(temps.paths[i].c_str(), parts[i].path.c_str()) != 0) {
      throw Error(
          "convert-nifti: cannot move '" + temps.paths[i] + "' to '" +
          parts[i].path + "': " + std::strerror(errno));
    }
    temps.paths[i].clear();  // published: nothing to remove
  }
  return result;
}

}  // namespace memtrain
