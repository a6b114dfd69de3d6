// Opening a NIfTI-1, NIfTI-2 or Analyze 7.5 file: its raw header read and
// checked as nibabel checks it (docs/data-convert.md "Input") before libnifti,
// which repairs bad headers silently, reads it; the transform of an Analyze
// file given its orientation; the memory a grid may take. The voxels are
// read in nifti_read.cpp.

#include <nifti2_io.h>
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
#include <sstream>

#include "formats/nifti/nifti_read.h"
#include "memtrain/formats/nifti/nifti_volume.h"
#include "memtrain/util/error.h"
#include "memtrain/util/gzip_file.h"
#include "memtrain/util/host_memory.h"

namespace memtrain::nifti {
namespace {

constexpr const char* kSupported =
    "uint8, int8, int16, uint16, int32, uint32, int64, uint64, float32, "
    "float64";

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

std::string lower(std::string s) {
  for (char& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool ends_with(const std::string& s, const char* e) {
  const size_t n = std::strlen(e);
  return s.size() >= n && lower(s.substr(s.size() - n)) == e;
}

// A .hdr/.img pair (by name) rather than a single file.
bool pair_name(const std::string& path) {
  for (const char* e : {".hdr", ".hdr.gz", ".img", ".img.gz"})
    if (ends_with(path, e))
      return true;
  return false;
}

void check_file(const Nifti& n, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw Error(
        n.command + ": " + n.name() + ": " +
        (errno == ENOENT ? std::string("no such file")
                         : std::string(std::strerror(errno))));
  }
  MT_CHECK(
      !S_ISDIR(st.st_mode),
      n.command,
      ": ",
      n.name(),
      ": is a directory, not a file");
  MT_CHECK(
      S_ISREG(st.st_mode), n.command, ": ", n.name(), ": not a regular file");
  MT_CHECK(
      ::access(path.c_str(), R_OK) == 0,
      n.command,
      ": ",
      n.name(),
      ": cannot read (",
      std::strerror(errno),
      ")");
}

// The fields of a NIfTI-1, NIfTI-2 or Analyze 7.5 header as stored (in
// the machine's byte order, widened), before libnifti reads them.
struct RawHeader {
  int version = 1;          // 1, 2; 0 = Analyze 7.5 (348 bytes, no NIfTI magic)
  bool pair_magic = false;  // "ni1"/"ni2" (a .hdr/.img pair)
  std::string magic;        // bytes 344-347 of a 348-byte header, as text
  std::string header_path;
  int64_t dim[8] = {};
  double pixdim[8] = {};
  double vox_offset = 0;
  int64_t datatype = 0;
  double slope = 0, inter = 0;
  int64_t xyzt_units = 0;
  int64_t qform_code = 0, sform_code = 0;
  double quatern[3] = {}, qoffset[3] = {};
  double srow[12] = {};
};

// The bytes of a magic as text: printable characters as they are, others
// as \xNN.
std::string magic_str(const unsigned char* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    if (p[i] >= 32 && p[i] < 127) {
      s += static_cast<char>(p[i]);
    } else {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", p[i]);
      s += b;
    }
  }
  return s;
}

RawHeader read_raw_header(const Nifti& n) {
  RawHeader h;
  h.header_path = n.path;
  if (ends_with(n.path, ".img") || ends_with(n.path, ".img.gz")) {
    char* hdr = nifti_findhdrname(n.path.c_str());
    MT_CHECK(
        hdr != nullptr,
        n.command,
        ": ",
        n.name(),
        ": no header file beside it (an Analyze or NIfTI .img needs its "
        ".hdr)");
    h.header_path = hdr;
    std::free(hdr);
  }
  unsigned char b[540] = {};
  znzFile f = znzopen(
      h.header_path.c_str(), "rb", nifti_is_gzfile(h.header_path.c_str()));
  MT_CHECK(
      !znz_isnull(f),
      n.command,
      ": ",
      n.name(),
      ": cannot open '",
      h.header_path,
      "'");
  size_t got = znzread(b, 1, sizeof(b), f);  // (size_t)-1: a zlib error
  Xznzclose(&f);
  const std::string where = n.command + ": " + n.name() + ": ";
  if (got != sizeof(b)) {
    // zlib's gzread inflates a small file whole at the first read, and
    // fails it on a bad CRC-32 or length: read_gzip_file says which.
    if (gzipped(h.header_path))
      read_gzip_file(h.header_path, file_who(n, h.header_path), {});
    MT_CHECK(got <= sizeof(b), where, "cannot read its header");
  }
  auto i32 = [&](size_t o, bool swap) {
    uint32_t u;
    std::memcpy(&u, b + o, 4);
    return static_cast<int32_t>(swap ? __builtin_bswap32(u) : u);
  };
  const int32_t size = i32(0, false);
  const int32_t size_swapped = i32(0, true);
  bool swap = false;
  if (size == 348 || size == 540) {
    h.version = size == 348 ? 1 : 2;
  } else if (size_swapped == 348 || size_swapped == 540) {
    h.version = size_swapped == 348 ? 1 : 2;
    swap = true;
  } else {
    throw Error(
        where + "not a NIfTI file: sizeof_hdr = " +
        (got < 4 ? std::string("(") + std::to_string(got) + " bytes)"
                 : std::to_string(size)) +
        "; a NIfTI-1 (or Analyze 7.5) header has 348, a NIfTI-2 header 540");
  }
  const size_t need = h.version == 1 ? 348 : 540;
  MT_CHECK(
      got >= need,
      where,
      "truncated header: ",
      got,
      " bytes of the ",
      need,
      " of a NIfTI-",
      h.version,
      " header");
  auto i16 = [&](size_t o) {
    uint16_t u;
    std::memcpy(&u, b + o, 2);
    return static_cast<int16_t>(swap ? __builtin_bswap16(u) : u);
  };
  auto i64 = [&](size_t o) {
    uint64_t u;
    std::memcpy(&u, b + o, 8);
    return static_cast<int64_t>(swap ? __builtin_bswap64(u) : u);
  };
  auto f32 = [&](size_t o) {
    const uint32_t u = static_cast<uint32_t>(i32(o, swap));
    float x;
    std::memcpy(&x, &u, 4);
    return static_cast<double>(x);
  };
  auto f64 = [&](size_t o) {
    const uint64_t u = static_cast<uint64_t>(i64(o));
    double x;
    std::memcpy(&x, &u, 8);
    return x;
  };
  const bool pair = pair_name(n.path);
  const std::string kind =
      pair ? "a .hdr/.img pair's header" : "a single file (.nii, .nii.gz)";
  // A pair's magic in a single file, or the other way round.
  auto wrong_kind = [&](const unsigned char* m, bool pair_magic, int v) {
    const std::string want = (pair ? "ni" : "n+") + std::to_string(v);
    throw Error(
        where + "magic '" + magic_str(m, 3) + "' marks " +
        (pair_magic ? "a .hdr/.img pair's header" : "a single .nii file") +
        ", but this is " + kind + ", which has '" + want +
        "' (rename the file or fix the magic)");
  };
  if (h.version == 1) {
    const unsigned char* m = b + 344;
    h.magic = magic_str(m, 4);
    if (std::memcmp(m, "n+1\0", 4) == 0 || std::memcmp(m, "ni1\0", 4) == 0) {
      h.pair_magic = m[1] == 'i';
    } else {
      h.version = 0;  // Analyze 7.5
    }
    if (h.version == 1 && h.pair_magic != pair)
      wrong_kind(m, h.pair_magic, 1);
    for (int i = 0; i < 8; ++i) {
      h.dim[i] = i16(40 + 2 * i);
      h.pixdim[i] = f32(76 + 4 * i);
    }
    h.datatype = i16(70);
    h.vox_offset = f32(108);
    h.slope = f32(112);
    h.inter = f32(116);
    h.xyzt_units = b[123];
    h.qform_code = i16(252);
    h.sform_code = i16(254);
    for (int i = 0; i < 3; ++i) {
      h.quatern[i] = f32(256 + 4 * i);
      h.qoffset[i] = f32(268 + 4 * i);
    }
    for (int i = 0; i < 12; ++i)
      h.srow[i] = f32(280 + 4 * i);
  } else {
    const unsigned char* m = b + 4;
    const bool single = std::memcmp(m, "n+2\0", 4) == 0;
    const bool paired = std::memcmp(m, "ni2\0", 4) == 0;
    MT_CHECK(
        single || paired,
        where,
        "magic '",
        magic_str(m, 4),
        "' (bytes 4-7 of a 540-byte NIfTI-2 header) is not a NIfTI-2 magic; "
        "a NIfTI-2 file has 'n+2' (.nii) or 'ni2' (.hdr/.img)");
    h.pair_magic = paired;
    if (h.pair_magic != pair)
      wrong_kind(m, h.pair_magic, 2);
    for (int i = 0; i < 8; ++i) {
      h.dim[i] = i64(16 + 8 * i);
      h.pixdim[i] = f64(104 + 8 * i);
    }
    h.datatype = i16(12);
    h.vox_offset = static_cast<double>(i64(168));
    h.slope = f64(176);
    h.inter = f64(184);
    h.qform_code = i32(344, swap);
    h.sform_code = i32(348, swap);
    for (int i = 0; i < 3; ++i) {
      h.quatern[i] = f64(352 + 8 * i);
      h.qoffset[i] = f64(376 + 8 * i);
    }
    for (int i = 0; i < 12; ++i)
      h.srow[i] = f64(400 + 8 * i);
    h.xyzt_units = i32(500, swap);
  }
  return h;
}

std::string datatype_name(int64_t dt) {
  // nifti_datatype_is_valid(DT_BINARY, 1) is false: the name tells.
  const std::string name =
      dt < INT16_MIN || dt > INT16_MAX
          ? std::string()
          : std::string(nifti_datatype_string(static_cast<int>(dt)));
  if (name.empty() || name.find("ILLEGAL") != std::string::npos)
    return "code " + std::to_string(dt) + " (not a NIfTI datatype)";
  return lower(name) + " (code " + std::to_string(dt) + ")";
}

// The checks of docs/data-convert.md "Input" on the raw header.
void check_raw_header(
    const Nifti& n, const RawHeader& h, const std::string& orientation) {
  const std::string where = n.command + ": " + n.name() + ": ";
  const std::string fix = " (fix the header, e.g. with nibabel)";
  if (h.version == 0 && orientation.empty()) {
    throw Error(
        where + "no NIfTI magic (bytes 344-347 are '" + h.magic +
        "'; a NIfTI-1 file has 'n+1' (.nii) or 'ni1' (.hdr/.img) there): an "
        "Analyze 7.5 header, which declares no "
        "orientation, so reading it could mirror the volume; refused. If it "
        "is Analyze 7.5, pass --analyze-orientation with the directions of "
        "its voxel axes i, j, k (nibabel's aff2axcodes, e.g. LAS for "
        "nibabel's Analyze default); if it is a NIfTI file, fix its magic");
  }
  // dim: 1..7 dimensions, each used one >= 1.
  MT_CHECK(
      h.dim[0] >= 1 && h.dim[0] <= 7,
      where,
      "dim[0] = ",
      h.dim[0],
      "; a NIfTI file has 1..7 dimensions (dim[0])",
      fix);
  for (int i = 1; i <= h.dim[0]; ++i)
    MT_CHECK(
        h.dim[i] >= 1,
        where,
        "dim[",
        i,
        "] = ",
        h.dim[i],
        "; each used dimension (dim[1..dim[0]], dim[0] = ",
        h.dim[0],
        ") must be >= 1",
        fix);
  // datatype: known and supported.
  if (!supported_type(static_cast<int>(h.datatype)) ||
      h.datatype != static_cast<int16_t>(h.datatype)) {
    throw Error(
        where + "datatype " + datatype_name(h.datatype) +
        " is not supported; supported: real scalars (" + kSupported + ")");
  }
  // pixdim of the spatial axes in use (all three with a qform).
  const int spatial = h.version > 0 && h.qform_code > 0
                          ? 3
                          : static_cast<int>(std::min<int64_t>(3, h.dim[0]));
  for (int i = 1; i <= spatial; ++i) {
    const double p = h.pixdim[i];
    MT_CHECK(
        std::isfinite(p) && p > 0,
        where,
        "pixdim[",
        i,
        "] = ",
        fmt(p),
        "; the voxel size of a spatial axis must be finite and > 0 (fix the "
        "header, e.g. with nibabel's header.set_zooms)");
  }
  // vox_offset: after the header (+ 4 extension bytes) in a single file.
  const double min_offset = h.pair_magic || pair_name(n.path) ? 0
                            : h.version == 2                  ? 544
                                                              : 352;
  MT_CHECK(
      std::isfinite(h.vox_offset) && h.vox_offset >= min_offset &&
              h.vox_offset<
                  9.0e15,
                  where,
                  "vox_offset = ",
                  fmt(h.vox_offset),
                  "; the voxels of ",
                  min_offset> 0
          ? "a single-file NIfTI-" + std::to_string(h.version) +
                " (or Analyze) start at byte " + fmt(min_offset) + " or later"
          : std::string("a .hdr/.img pair start at byte 0 or later"),
      " (vox_offset finite and >= ",
      fmt(min_offset),
      ")",
      fix);
  if (h.version == 0)
    return;  // Analyze 7.5: no scaling, no transforms
  MT_CHECK(
      !(std::isfinite(h.slope) && h.slope != 0) || std::isfinite(h.inter),
      where,
      "scl_inter = ",
      fmt(h.inter),
      " with scl_slope = ",
      fmt(h.slope),
      "; a scaled file's intercept must be finite",
      fix);
  // Transforms: codes 0..5 (NIFTI_XFORM_*), a used transform valid.
  for (const auto& [name, code] :
       {std::pair<const char*, int64_t>{"qform_code", h.qform_code},
        std::pair<const char*, int64_t>{"sform_code", h.sform_code}}) {
    MT_CHECK(
        code >= 0 && code <= 5,
        where,
        name,
        " = ",
        code,
        "; valid codes are 0 (none), 1 (scanner), 2 (aligned), 3 "
        "(Talairach), 4 (MNI 152), 5 (other template)",
        fix);
  }
  if (h.sform_code > 0) {
    const char* rows[3] = {"srow_x", "srow_y", "srow_z"};
    for (int e = 0; e < 12; ++e)
      MT_CHECK(
          std::isfinite(h.srow[e]),
          where,
          rows[e / 4],
          "[",
          e % 4,
          "] = ",
          fmt(h.srow[e]),
          " with sform_code = ",
          h.sform_code,
          "; the sform must be finite",
          fix);
    const double* r = h.srow;
    const double det = r[0] * (r[5] * r[10] - r[6] * r[9]) -
                       r[1] * (r[4] * r[10] - r[6] * r[8]) +
                       r[2] * (r[4] * r[9] - r[5] * r[8]);
    double scale = 1;
    for (int row = 0; row < 3; ++row)
      scale *= std::sqrt(
          r[row * 4] * r[row * 4] + r[row * 4 + 1] * r[row * 4 + 1] +
          r[row * 4 + 2] * r[row * 4 + 2]);
    if (!(std::fabs(det) > 1e-6 * scale && scale > 0)) {
      std::string m;
      for (int e = 0; e < 12; ++e)
        m += (e == 0 ? "[" : e % 4 == 0 ? "; " : " ") + fmt(r[e]);
      throw Error(
          where + "sform " + m +
          "] (sform_code = " + std::to_string(h.sform_code) +
          ") is singular (determinant " + fmt(det) +
          "); a transform must map the voxel axes to three independent "
          "directions" +
          fix);
    }
  }
  if (h.qform_code > 0) {
    const char* names[3] = {"quatern_b", "quatern_c", "quatern_d"};
    const char* offs[3] = {"qoffset_x", "qoffset_y", "qoffset_z"};
    double norm = 0;
    for (int i = 0; i < 3; ++i) {
      MT_CHECK(
          std::isfinite(h.quatern[i]) && std::isfinite(h.qoffset[i]),
          where,
          std::isfinite(h.quatern[i]) ? offs[i] : names[i],
          " = ",
          fmt(std::isfinite(h.quatern[i]) ? h.qoffset[i] : h.quatern[i]),
          " with qform_code = ",
          h.qform_code,
          "; the qform must be finite",
          fix);
      norm += h.quatern[i] * h.quatern[i];
    }
    MT_CHECK(
        norm <= 1 + 1e-6,
        where,
        "quatern_b^2 + quatern_c^2 + quatern_d^2 = ",
        fmt(norm),
        " (b = ",
        fmt(h.quatern[0]),
        ", c = ",
        fmt(h.quatern[1]),
        ", d = ",
        fmt(h.quatern[2]),
        ") with qform_code = ",
        h.qform_code,
        "; a unit quaternion has at most 1",
        fix);
    const double qfac = h.pixdim[0];
    MT_CHECK(
        qfac == 1 || qfac == -1 || qfac == 0,
        where,
        "pixdim[0] (qfac) = ",
        fmt(qfac),
        " with qform_code = ",
        h.qform_code,
        "; it must be 1 or -1 (0 is read as 1)",
        fix);
  }
}

// The voxels the header declares, against what an uncompressed single file
// holds (a wrong dim, or a truncated file) and against the memory they
// would be read into, before libnifti allocates anything from them.
void check_declared_size(const Nifti& n, const RawHeader& h) {
  int nbyper = 0, swapsize = 0;
  nifti_datatype_sizes(static_cast<int>(h.datatype), &nbyper, &swapsize);
  double voxels = 1;
  std::string dims;
  for (int64_t i = 1; i <= h.dim[0]; ++i) {
    voxels *= static_cast<double>(h.dim[i]);
    dims += (i > 1 ? "x" : "") + std::to_string(h.dim[i]);
  }
  const double bytes = voxels * nbyper;
  const std::string declared = "its header declares " + dims + " voxels of " +
                               std::to_string(nbyper) + " bytes (" +
                               format_bytes(bytes) + ")";
  struct stat st {};
  if (!pair_name(n.path) && !ends_with(n.path, ".gz") &&
      ::stat(n.path.c_str(), &st) == 0) {
    const double holds = static_cast<double>(st.st_size) - h.vox_offset;
    MT_CHECK(
        bytes <= holds,
        n.command,
        ": ",
        n.name(),
        ": ",
        declared,
        " from vox_offset ",
        fmt(h.vox_offset),
        ", but the file holds ",
        static_cast<int64_t>(st.st_size),
        " bytes: it is truncated, or a dim[1..",
        h.dim[0],
        "] is wrong (fix the header or re-export the file)");
  }
  const uint64_t available = available_host_memory();
  MT_CHECK(
      available == 0 || bytes <= static_cast<double>(available),
      n.command,
      ": ",
      n.name(),
      ": ",
      declared,
      ", more than the ",
      format_bytes(static_cast<double>(available)),
      " of memory available to read them into (MemAvailable): a dim[1..",
      h.dim[0],
      "] is wrong, or the file needs a machine with more memory");
}

}  // namespace

Nifti open_header(
    const std::string& command,
    const std::string& flag,
    const std::string& path,
    const std::string& analyze_orientation) {
  MT_CHECK(!path.empty(), command, ": ", flag, " is required");
  Nifti n;
  n.command = command;
  n.flag = flag;
  n.path = path;
  check_file(n, path);
  if (!analyze_orientation.empty())
    check_axis_code(command, analyze_orientation);
  // The raw header first: libnifti repairs bad headers silently.
  const RawHeader h = read_raw_header(n);
  check_raw_header(n, h, analyze_orientation);
  check_declared_size(n, h);
  nifti_set_debug_level(0);  // the library prints its errors otherwise
  n.im.reset(nifti_image_read(path.c_str(), 0));
  if (!n.im) {
    throw Error(
        n.command + ": " + n.name() +
        ": not a NIfTI file (no valid NIfTI-1 or NIfTI-2 header)");
  }
  const nifti_image* im = n.im.get();
  MT_CHECK(
      im->nu <= 1 && im->nv <= 1 && im->nw <= 1,
      n.command,
      ": ",
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
  // What was checked is what libnifti read.
  MT_CHECK(
      im->datatype == h.datatype && im->nx == h.dim[1] &&
          (h.dim[0] < 2 || im->ny == h.dim[2]) &&
          (h.dim[0] < 3 || im->nz == h.dim[3]),
      n.command,
      ": ",
      n.name(),
      ": libnifti read another header than the one checked (datatype ",
      im->datatype,
      ", ",
      im->nx,
      "x",
      im->ny,
      "x",
      im->nz,
      "); refused");
  n.nx = std::max<int64_t>(1, im->nx);
  n.ny = std::max<int64_t>(1, im->ny);
  n.nz = std::max<int64_t>(1, im->nz);
  n.nt = std::max<int64_t>(1, im->nt);
  double to_mm = 1.0;
  switch (h.version == 0 ? NIFTI_UNITS_MM : (h.xyzt_units & 7)) {
    case NIFTI_UNITS_METER:
      to_mm = 1000.0;
      break;
    case NIFTI_UNITS_MICRON:
      to_mm = 0.001;
      break;
    default:  // mm or unknown: mm
      break;
  }
  // The spatial voxel sizes (checked > 0 where used; an unused axis of
  // one voxel without a valid size is 1, as nibabel's zooms).
  for (int a = 0; a < 3; ++a) {
    const double p = std::fabs(h.pixdim[a + 1]);
    n.pix_mm[a] = (std::isfinite(p) && p > 0 ? p : 1.0) * to_mm;
  }
  if (h.version == 0) {
    // nibabel's AnalyzeImage: no scaling (Analyze 7.5 has no scl_slope).
    n.analyze = true;
    n.given_affine = analyze_affine(
        analyze_orientation,
        {n.nx, n.ny, n.nz},
        {n.pix_mm[0], n.pix_mm[1], n.pix_mm[2]});
    return n;
  }
  n.slope = h.slope;
  n.inter = h.inter;
  n.scaled = std::isfinite(n.slope) && std::isfinite(n.inter) && n.slope != 0 &&
             !(n.slope == 1 && n.inter == 0);
  return n;
}

Affine analyze_affine(
    const std::string& code,
    const std::array<int64_t, 3>& dims,
    const std::array<double, 3>& pix) {
  MT_INTERNAL_ASSERT(code.size() == 3, "unchecked axis code '", code, "'");
  Affine a = identity_affine();
  a[0] = a[5] = a[10] = 0;
  for (int i = 0; i < 3; ++i) {
    const char c = static_cast<char>(std::toupper(code[i]));
    const int w = c == 'L' || c == 'R' ? 0 : c == 'P' || c == 'A' ? 1 : 2;
    const double sign = c == 'R' || c == 'A' || c == 'S' ? 1.0 : -1.0;
    a[w * 4 + i] = sign * pix[i];
  }
  for (int w = 0; w < 3; ++w) {
    double t = 0;
    for (int i = 0; i < 3; ++i)
      t -= a[w * 4 + i] * (std::max<int64_t>(1, dims[i]) - 1) / 2.0;
    a[w * 4 + 3] = t;
  }
  return a;
}

}  // namespace memtrain::nifti

namespace memtrain {

void check_axis_code(const std::string& command, const std::string& code) {
  bool ok = code.size() == 3;
  int seen[3] = {0, 0, 0};
  for (size_t i = 0; ok && i < code.size(); ++i) {
    const char c = code[i];
    const int w = c == 'L' || c == 'R'   ? 0
                  : c == 'A' || c == 'P' ? 1
                  : c == 'S' || c == 'I' ? 2
                                         : -1;
    ok = w >= 0 && seen[w]++ == 0;
  }
  MT_CHECK(
      ok,
      command,
      ": --analyze-orientation '",
      code,
      "' is not an axis code: three capital letters, the directions of the "
      "voxel axes i, j, k as nibabel's aff2axcodes writes them, one of L/R, "
      "one of A/P, one of S/I (e.g. LAS, nibabel's Analyze default, or RAS)");
}

int64_t check_nifti_headers(
    const std::string& command,
    const std::string& flag,
    const std::vector<std::string>& paths,
    const std::string& analyze_orientation) {
  int64_t n = 0;
  for (const std::string& p : paths)
    n += nifti::open_header(command, flag, p, analyze_orientation).analyze;
  return n;
}

}  // namespace memtrain
