#pragma once
// Reading NIfTI-1 and NIfTI-2 files (libnifti2's nifti2_io: one reader for
// both, int64 dimensions) for convert-nifti, convert-dataset and predict:
// the header and its checks, voxels as float32 or as classes, the world
// transforms, and the resampling of [C, D, H, W] grids. Private to the
// library (src/formats/nifti/, src/convert/); no public header includes the
// NIfTI headers.

#include <nifti2_io.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memtrain/formats/nifti/label_map.h"
#include "memtrain/formats/nifti/orientation.h"

namespace memtrain::nifti {

struct NiftiFree {
  void operator()(nifti_image* p) const {
    nifti_image_free(p);
  }
};
using NiftiPtr = std::unique_ptr<nifti_image, NiftiFree>;

// What a file is, as read from its header (data not loaded yet).
struct Nifti {
  std::string command;  // "convert-nifti", "predict": starts messages
  std::string flag;     // "--image", "--labels", "--input", "case X image"
  std::string path;
  NiftiPtr im;
  // An Analyze 7.5 file (no NIfTI magic) accepted by --analyze-orientation:
  // `given_affine` is then the one built from that code (analyze_affine), the
  // only transform the file has.
  bool analyze = false;
  Affine given_affine = identity_affine();
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

// A number as messages print it (shortest form of an ostream).
std::string fmt(double v);

// Opens `path` (given as `flag` of `command`, for messages) and reads its
// header; throws memtrain::Error naming the file, the header field, its
// value and what a valid file has, before libnifti reads anything (it
// "repairs" bad headers silently): the raw header (NIfTI-1 or NIfTI-2,
// either byte order, gzipped or not) is checked as nibabel checks it
// (docs/data-convert.md "Input": magic and file kind, dim, pixdim, vox_offset,
// datatype, scl_inter, qform/sform codes and transforms). A file without
// the NIfTI magic is Analyze 7.5: refused unless `analyze_orientation` is
// an axis code (check_axis_code), which then gives its transform.
Nifti open_header(
    const std::string& command,
    const std::string& flag,
    const std::string& path,
    const std::string& analyze_orientation = "");
// Whether `file` is read as gzip: its name says so (libnifti's rule) and it
// starts with gzip's magic.
bool gzipped(const std::string& file);
// The start of a message about `file`, one of n's files: "COMMAND: NAME",
// and the file's path where it is not the one named (a pair's other file).
std::string file_who(const Nifti& n, const std::string& file);
// Reads the voxel data; a float voxel that is not finite is refused. A
// gzipped file is read in one pass to the end of its gzip stream, each
// member's CRC-32 and length (ISIZE) checked (read_gzip_file): a damaged
// stream that still inflates is refused, naming the file.
void load_data(Nifti& n);
// The world transforms a file declares (sform, qform), 3x4 each; an
// accepted Analyze file's is the one built from --analyze-orientation.
std::vector<std::array<double, 12>> transforms(const Nifti& n);
// The file's voxel-to-world transform as nibabel's get_best_affine: the
// sform if sform_code > 0, else the qform if qform_code > 0, else the
// Analyze default diag(-dx, dy, dz) centred on the grid (x flipped); an
// accepted Analyze file's from --analyze-orientation.
Affine best_affine(const Nifti& n);
// The transform of an Analyze file whose voxel axes i, j, k run toward the
// directions of `code` (e.g. "LAS"): each axis's voxel size with the sign
// of its letter, centred on the grid as nibabel's Analyze default.
Affine analyze_affine(
    const std::string& code,
    const std::array<int64_t, 3>& dims,
    const std::array<double, 3>& pix);
// Whether one transform of each (transforms()) is equal to 1e-3, or
// either file declares none.
bool same_transform(const Nifti& a, const Nifti& b);
// Same voxel grid, one 3D label volume, and (check_affine) the same
// transform (same_transform). `remedy` ends the transform message (how to
// accept such a pair, e.g. convert-nifti's --ignore-affine).
void check_same_grid(
    const Nifti& img,
    const Nifti& lbl,
    bool check_affine,
    const std::string& remedy =
        "fix the headers or pass --ignore-affine if the voxels do "
        "correspond");
// Image voxels as float32 (slope applied), NIfTI order = [C, D, H, W].
std::vector<float> read_image(const Nifti& n);
// The classes a label volume must hold: 0..count-1 of `whose`
// ("dataset.json's labels", "the model's 2 classes"; default: uint8's).
struct LabelClasses {
  int64_t count = 256;
  std::string whose;
  std::string remedy;  // ends the refusal, e.g. " (map them with ...)"
  // The command's option that maps labels to classes; empty: it has none
  // (convert-dataset: dataset.json's labels are the classes).
  std::string map_flag = "--label-map";
};
// Label voxels mapped to classes (uint8), NIfTI order = [D, H, W]. Without
// `rules` the values must be integers 0..255; every class must be below
// `classes.count`: else memtrain::Error naming the file, the first such
// voxel, its value, `classes` and how many voxels are beyond them.
std::vector<uint8_t> read_labels(
    const Nifti& n,
    const std::vector<LabelRule>& rules,
    const LabelClasses& classes = {});

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
AxisMap axis_map(int64_t n, double pix, double mm, int64_t m);

// Nearest-neighbour resampling of `mask` ([D, H, W] of `dims` voxels of
// `from` spacing) to `to_dims` voxels of `to` spacing on resample_linear's
// grid mapping (nifti_volume.h); ties go to the higher index.
std::vector<uint8_t> resample_nearest(
    const std::vector<uint8_t>& mask,
    const std::array<int64_t, 3>& dims,
    const std::array<double, 3>& from,
    const std::array<int64_t, 3>& to_dims,
    const std::array<double, 3>& to);

// Resamples image (trilinear) and mask (nearest) of grid *g with voxel
// sizes pix_dhw to isotropic `mm` voxels; *g gets the new sizes.
void resample(
    std::vector<float>* image,
    std::vector<uint8_t>* mask,
    Grid* g,
    const std::array<double, 3>& pix_dhw,
    double mm);

}  // namespace memtrain::nifti
