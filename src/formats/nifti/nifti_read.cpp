#include "formats/nifti/nifti_read.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <sstream>

#include "memtrain/formats/nifti/nifti_volume.h"
#include "memtrain/util/error.h"
#include "memtrain/util/gzip_file.h"

namespace memtrain::nifti {

std::string fmt(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

namespace {

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

// The refusal of voxel `i` (in file order) of value `v`, not a finite
// `type`.
[[noreturn]] void throw_nonfinite(
    const Nifti& n, size_t i, double v, const char* type) {
  const size_t plane = static_cast<size_t>(n.nx * n.ny);
  throw Error(
      n.command + ": " + n.name() + ": voxel (" + std::to_string(i % n.nx) +
      "," + std::to_string((i / n.nx) % n.ny) + "," +
      std::to_string((i / plane) % n.nz) + ") is " + fmt(v) +
      " (not a finite " + type + "); replace NaN/Inf voxels first");
}

// libnifti sets NaN and Inf float voxels to 0 as it loads them, silently:
// the file's raw float32/float64 voxels are fed here first, in order, and
// the first non-finite one is refused.
class FiniteFloats {
 public:
  explicit FiniteFloats(const Nifti& n)
      : n_(n),
        nb_(static_cast<size_t>(n.im->nbyper)),
        on_(n.im->datatype == DT_FLOAT32 || n.im->datatype == DT_FLOAT64),
        swap_(n.im->byteorder != nifti_short_order()) {}
  bool on() const {
    return on_;
  }
  // The next `len` bytes of the voxel data.
  void feed(const unsigned char* p, size_t len) {
    if (!on_)
      return;
    if (part_ > 0) {  // the rest of an element split between two pieces
      const size_t take = std::min(len, nb_ - part_);
      std::memcpy(elem_ + part_, p, take);
      part_ += take;
      p += take;
      len -= take;
      if (part_ < nb_)
        return;
      part_ = 0;
      check(elem_);
    }
    for (; len >= nb_; p += nb_, len -= nb_)
      check(p);
    std::memcpy(elem_, p, len);
    part_ = len;
  }

 private:
  void check(const unsigned char* e) {
    double v;
    if (nb_ == 4) {
      uint32_t u;
      std::memcpy(&u, e, 4);
      u = swap_ ? __builtin_bswap32(u) : u;
      float x;
      std::memcpy(&x, &u, 4);
      v = x;
    } else {
      uint64_t u;
      std::memcpy(&u, e, 8);
      u = swap_ ? __builtin_bswap64(u) : u;
      std::memcpy(&v, &u, 8);
    }
    const size_t i = done_++;
    if (!std::isfinite(v))
      throw_nonfinite(n_, i, v, "float");
  }

  const Nifti& n_;
  const size_t nb_;
  const bool on_;
  const bool swap_;
  unsigned char elem_[8] = {};
  size_t part_ = 0;  // bytes of elem_ filled
  size_t done_ = 0;  // voxels checked
};

// The voxels of a gzipped file in one pass: the file inflated whole with
// every check of the format (read_gzip_file: each member's CRC-32 and
// length; libnifti reads only the bytes it needs, so zlib, which checks
// them at the member's trailer, may never get there and a damaged stream
// that still inflates gave wrong voxels), the data part copied into the
// image and byte-swapped to this machine's order as nifti_image_load does,
// its floats checked finite on the way.
void load_gzipped(Nifti& n) {
  nifti_image* im = n.im.get();
  if (im->fname != nullptr && std::strcmp(im->fname, im->iname) != 0 &&
      gzipped(im->fname))
    read_gzip_file(im->fname, file_who(n, im->fname), {});  // a pair's header
  const size_t begin = static_cast<size_t>(im->iname_offset);
  const size_t bytes =
      static_cast<size_t>(im->nvox) * static_cast<size_t>(im->nbyper);
  std::unique_ptr<unsigned char, decltype(&std::free)> data(
      static_cast<unsigned char*>(std::calloc(std::max<size_t>(bytes, 1), 1)),
      &std::free);
  if (!data)
    throw std::bad_alloc();
  FiniteFloats floats(n);
  size_t at = 0;  // offset in the inflated stream of the bytes passed
  read_gzip_file(
      im->iname,
      file_who(n, im->iname),
      [&](const unsigned char* p, size_t len) {
        const size_t from = std::max(at, begin);
        const size_t to = std::min(at + len, begin + bytes);
        if (from < to) {
          std::memcpy(data.get() + (from - begin), p + (from - at), to - from);
          floats.feed(p + (from - at), to - from);
        }
        at += len;
      });
  MT_CHECK(
      at >= begin + bytes,
      file_who(n, im->iname),
      ": its voxel data ends at byte ",
      at,
      " of the ",
      begin + bytes,
      " its header declares (a truncated file?)");
  if (im->swapsize > 1 && im->byteorder != nifti_short_order())
    nifti_swap_Nbytes(im->nvox, im->swapsize, data.get());
  im->data = data.release();
}

// A float file's raw voxels checked finite before libnifti loads them (the
// data part is read twice).
void check_finite_floats(const Nifti& n) {
  const nifti_image* im = n.im.get();
  FiniteFloats floats(n);
  if (!floats.on())
    return;
  znzFile f = znzopen(im->iname, "rb", nifti_is_gzfile(im->iname));
  if (znz_isnull(f))
    return;  // nifti_image_load reports it
  std::vector<unsigned char> buf(size_t{1} << 20);
  size_t left = static_cast<size_t>(im->nvox) * static_cast<size_t>(im->nbyper);
  bool ok = znzseek(f, im->iname_offset, SEEK_SET) >= 0;
  try {
    while (ok && left > 0) {
      const size_t want = std::min(buf.size(), left);
      const size_t got = znzread(buf.data(), 1, want, f);
      if (got == 0 || got > want)  // (size_t)-1: a zlib error
        break;                     // nifti_image_load reports it
      floats.feed(buf.data(), got);
      left -= got;
    }
  } catch (...) {
    Xznzclose(&f);
    throw;
  }
  Xznzclose(&f);
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

}  // namespace

bool gzipped(const std::string& file) {
  return nifti_is_gzfile(file.c_str()) && has_gzip_magic(file);
}

std::string file_who(const Nifti& n, const std::string& file) {
  return n.command + ": " + n.name() +
         (file == n.path ? std::string() : ": '" + file + "'");
}

void load_data(Nifti& n) {
  if (n.im->iname != nullptr && gzipped(n.im->iname)) {
    load_gzipped(n);
    return;
  }
  check_finite_floats(n);
  MT_CHECK(
      nifti_image_load(n.im.get()) == 0 && n.im->data,
      n.command,
      ": ",
      n.name(),
      ": cannot read the voxel data (truncated or corrupt file?)");
}

// The world transforms a file declares (sform, qform), 3x4 each.
std::vector<std::array<double, 12>> transforms(const Nifti& n) {
  const nifti_image* im = n.im.get();
  std::vector<std::array<double, 12>> out;
  if (n.analyze) {
    std::array<double, 12> a{};
    std::copy(n.given_affine.begin(), n.given_affine.begin() + 12, a.begin());
    return {a};
  }
  auto add = [&](const nifti_dmat44& m) {
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

Affine best_affine(const Nifti& n) {
  if (n.analyze)
    return n.given_affine;
  const nifti_image* im = n.im.get();
  Affine a = identity_affine();
  const nifti_dmat44* m = im->sform_code > 0   ? &im->sto_xyz
                          : im->qform_code > 0 ? &im->qto_xyz
                                               : nullptr;
  if (m != nullptr) {
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 4; ++c)
        a[r * 4 + c] = m->m[r][c];
    return a;
  }
  const double zoom[3] = {
      -std::fabs(im->dx), std::fabs(im->dy), std::fabs(im->dz)};
  const int64_t dims[3] = {im->nx, im->ny, im->nz};
  for (int r = 0; r < 3; ++r) {
    const double z = zoom[r] == 0 ? 1.0 : zoom[r];
    a[r * 4 + r] = z;
    a[r * 4 + 3] = -(std::max<int64_t>(1, dims[r]) - 1) / 2.0 * z;
  }
  return a;
}

bool same_transform(const Nifti& a, const Nifti& b) {
  const auto ta = transforms(a);
  const auto tb = transforms(b);
  if (ta.empty() || tb.empty())
    return true;  // one of them declares no orientation: nothing to compare
  for (const auto& x : ta) {
    for (const auto& y : tb) {
      bool same = true;
      for (int e = 0; e < 12; ++e)
        same = same && std::fabs(x[e] - y[e]) <= 1e-3;
      if (same)
        return true;
    }
  }
  return false;
}

void check_same_grid(
    const Nifti& img,
    const Nifti& lbl,
    bool check_affine,
    const std::string& remedy) {
  MT_CHECK(
      img.nx == lbl.nx && img.ny == lbl.ny && img.nz == lbl.nz,
      img.command,
      ": grid mismatch: ",
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
      lbl.command,
      ": ",
      lbl.name(),
      ": has ",
      lbl.nt,
      " volumes (4D); labels must be one 3D volume");
  if (!check_affine || same_transform(img, lbl))
    return;
  const auto ti = transforms(img);
  const auto tl = transforms(lbl);
  throw Error(
      img.command + ": " + img.name() + " and " + lbl.name() +
      " have the same grid " + img.grid() +
      " but different voxel-to-world transforms (image " +
      transform_str(ti[0]) + ", labels " + transform_str(tl[0]) +
      "): the labels would not line up with the image; " + remedy);
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
      if (!std::isfinite(out[i]))
        throw_nonfinite(n, i, v, "float32");
    }
  });
  return out;
}

// Label voxels mapped to classes (uint8), NIfTI order = [D, H, W].
std::vector<uint8_t> read_labels(
    const Nifti& n,
    const std::vector<LabelRule>& rules,
    const LabelClasses& classes) {
  const size_t count = n.voxels3d();
  std::vector<uint8_t> out(count);
  auto where = [&](size_t i) {
    const size_t plane = static_cast<size_t>(n.nx * n.ny);
    return "(" + std::to_string(i % n.nx) + "," +
           std::to_string((i / n.nx) % n.ny) + "," + std::to_string(i / plane) +
           ")";
  };
  const std::string last = std::to_string(classes.count - 1);
  const bool mapped = !classes.map_flag.empty();
  const std::string within =
      classes.whose.empty() ? std::string()
                            : ", here " + classes.whose + " (0.." + last + ")";
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
            n.command + ": " + n.name() + ": voxel " + where(i) +
            " has label " + fmt(v) + "; " +
            (mapped ? "without " + classes.map_flag + " " : std::string()) +
            "labels must be non-negative integers" + within +
            (mapped ? " (map them with " + classes.map_flag + ")" : ""));
      }
      if (rv > 255) {
        throw Error(
            n.command + ": " + n.name() + ": voxel " + where(i) +
            " has label " + fmt(v) + "; classes are stored as uint8 (0..255)" +
            (mapped ? ": group the labels with " + classes.map_flag : ""));
      }
      out[i] = static_cast<uint8_t>(rv);
    }
  });
  if (classes.count >= 256)
    return out;
  // The first voxel beyond the classes, and how many are.
  size_t first = count, beyond = 0;
  for (size_t i = 0; i < count; ++i) {
    if (out[i] < classes.count)
      continue;
    if (beyond++ == 0)
      first = i;
  }
  if (beyond == 0)
    return out;
  throw Error(
      n.command + ": " + n.name() + ": voxel " + where(first) +
      (rules.empty() ? " has label " : " is mapped to class ") +
      std::to_string(out[first]) + ", not in " + classes.whose + " (0.." +
      last + "); " + std::to_string(beyond) + " voxel(s) have a " +
      (rules.empty() ? "label" : "class") +
      " >= " + std::to_string(classes.count) + classes.remedy);
}

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

std::vector<uint8_t> resample_nearest(
    const std::vector<uint8_t>& mask,
    const std::array<int64_t, 3>& dims,
    const std::array<double, 3>& from,
    const std::array<int64_t, 3>& to_dims,
    const std::array<double, 3>& to) {
  MT_INTERNAL_ASSERT(
      mask.size() == static_cast<size_t>(dims[0] * dims[1] * dims[2]));
  AxisMap maps[3];
  for (int a = 0; a < 3; ++a)
    maps[a] = axis_map(dims[a], from[a], to[a], to_dims[a]);
  const AxisMap &md = maps[0], &mh = maps[1], &mw = maps[2];
  const int64_t H = dims[1], W = dims[2];
  std::vector<uint8_t> out(
      static_cast<size_t>(to_dims[0] * to_dims[1] * to_dims[2]));
  uint8_t* dst = out.data();
  for (int64_t z = 0; z < to_dims[0]; ++z)
    for (int64_t y = 0; y < to_dims[1]; ++y)
      for (int64_t x = 0; x < to_dims[2]; ++x)
        *dst++ = mask[(md.nn[z] * H + mh.nn[y]) * W + mw.nn[x]];
  return out;
}

void resample(
    std::vector<float>* image,
    std::vector<uint8_t>* mask,
    Grid* g,
    const std::array<double, 3>& pix_dhw,
    double mm) {
  const std::array<int64_t, 3> n = {g->d, g->h, g->w};
  const std::array<double, 3> to = {mm, mm, mm};
  const std::array<int64_t, 3> m = resampled_dims(n, pix_dhw, to);
  *image = resample_linear(*image, g->c, n, pix_dhw, m, to);
  *mask = resample_nearest(*mask, n, pix_dhw, m, to);
  g->d = m[0];
  g->h = m[1];
  g->w = m[2];
}

}  // namespace memtrain::nifti
