#pragma once
// NIfTI cases for `memtrain predict`: an image read into memtrain's axis
// order, its label volume, a label map written back on the image's own grid
// and header, and the trilinear resampling between voxel spacings that
// convert-nifti --resample uses. No LibTorch, no NIfTI headers here.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "memtrain/formats/nifti/orientation.h"

namespace memtrain {

// An image NIfTI-1 or NIfTI-2 file's voxels: [C, D, H, W] float32
// (scl_slope applied), D = z (k), H = y (j), W = x (i) as the file stores
// them (docs/data-convert.md "Output": no reorientation), C = its 4th
// dimension.
struct NiftiCase {
  std::string path;
  std::array<int64_t, 4> shape{1, 1, 1, 1};   // C, D, H, W
  std::array<double, 3> spacing_mm{1, 1, 1};  // D, H, W
  Affine affine = identity_affine();  // nibabel's best affine (orientation.h)
  std::vector<float> voxels;
};

// --analyze-orientation: "" (Analyze 7.5 files refused), or the
// three-letter axis code of an Analyze file's voxel axes i, j, k as
// nibabel's aff2axcodes writes it (e.g. LAS: i toward Left, j toward
// Anterior, k toward Superior): one of L/R, one of A/P, one of S/I, in
// any order. Throws memtrain::Error starting with `command` otherwise.
void check_axis_code(const std::string& command, const std::string& code);

// Opens the header of each of `paths` (flag `flag` of `command`, for
// messages) with every check of docs/data-convert.md "Input", reading no voxel:
// predict checks all its inputs before it writes any output. Returns how
// many are Analyze 7.5 files (accepted by `analyze_orientation`).
int64_t check_nifti_headers(
    const std::string& command,
    const std::string& flag,
    const std::vector<std::string>& paths,
    const std::string& analyze_orientation);

// Reads `path`; messages start with `command` and name `flag`. Throws
// memtrain::Error as convert-nifti does for a bad file. An Analyze 7.5
// file is read only with `analyze_orientation` (check_axis_code).
NiftiCase read_nifti_case(
    const std::string& command,
    const std::string& flag,
    const std::string& path,
    const std::string& analyze_orientation = "");
// A case of several files, one per channel group (nnU-Net's CASE_0000,
// CASE_0001, ...), their channels stacked in that order; every file must
// be on the first's grid and transform (else memtrain::Error naming both).
NiftiCase read_nifti_case(
    const std::string& command,
    const std::string& flag,
    const std::vector<std::string>& paths,
    const std::string& analyze_orientation = "");

// The label volume `path` ([D, H, W] classes, mapped by `label_map` as
// convert-nifti's --label-map; "" takes the values as classes), which must
// be on the grid of image `image_path` with the same voxel-to-world
// transform (else memtrain::Error naming both) and hold only the model's
// `num_classes` classes (else memtrain::Error naming the file, the first
// voxel beyond them, its value, how many are, and `num_classes`; a
// negative or fractional value without `label_map` likewise).
std::vector<uint8_t> read_nifti_case_labels(
    const std::string& command,
    const std::string& flag,
    const std::string& path,
    const std::string& image_path,
    const std::string& label_map,
    int64_t num_classes,
    const std::string& analyze_orientation = "");

// Writes `labels` ([D, H, W] of the grid of `reference`, an image NIfTI
// file) to `out` (.nii or .nii.gz) as a 3D uint8 NIfTI-1 image with the
// reference's dimensions, voxel sizes, units, qform and sform, so that it
// overlays the reference in any viewer (an Analyze reference, read with
// `analyze_orientation`: its transform as the sform, code 2). Written to a
// temporary file in the same folder and renamed: an existing `out` is
// never half-written.
void write_nifti_labels_like(
    const std::string& reference,
    const std::vector<uint8_t>& labels,
    const std::string& out,
    const std::string& analyze_orientation = "");

// The grid of `dims` voxels of `spacing` resampled to `target` spacing:
// max(1, round(n * spacing / target)) voxels along each axis.
std::array<int64_t, 3> resampled_dims(
    const std::array<int64_t, 3>& dims,
    const std::array<double, 3>& spacing,
    const std::array<double, 3>& target);

// resampled_dims for a resampling that must fit in memory: the grid is
// computed in double first, and refused (memtrain::Error) when an axis
// overflows or the output volume ([C, d, h, w] float32 + uint8 labels, on
// top of the input's) exceeds the host memory available now (MemAvailable).
// The message starts with `command`, names `what` (e.g. "--resample
// 1e-06", "case X") and the grid, its size and what is available, and ends
// with `remedy` (e.g. "use a larger --resample").
std::array<int64_t, 3> resampled_dims_within_memory(
    const std::string& command,
    const std::string& what,
    const std::array<int64_t, 3>& dims,
    const std::array<double, 3>& spacing,
    const std::array<double, 3>& target,
    int64_t channels,
    const std::string& remedy);

// Trilinear resampling of `src` ([C, D, H, W] of `dims` voxels of `from`
// spacing) to `to_dims` voxels of `to` spacing, the two grids centred on
// each other (output voxel o maps to input coordinate
// (n-1)/2 + (o - (m-1)/2) * to / from, clamped: border voxels repeat).
std::vector<float> resample_linear(
    const std::vector<float>& src,
    int64_t channels,
    const std::array<int64_t, 3>& dims,
    const std::array<double, 3>& from,
    const std::array<int64_t, 3>& to_dims,
    const std::array<double, 3>& to);

// x -> x * scale + shift.
struct IntensityNorm {
  double scale = 1.0;
  double shift = 0.0;
};

// The z-score over the non-zero values of `voxels` (all channels
// together): scale = 1 / std, shift = -mean / std; without non-zero values
// (or with std 0) scale 1 and shift 0 (-mean). convert-nifti's /volumes
// normalisation, and predict's for each case.
IntensityNorm nonzero_zscore(const std::vector<float>& voxels);

// nonzero_zscore of each channel of `voxels` ([C, ...], `channels` equal
// parts) applied to it in place: convert-dataset's and predict's
// normalisation (with one channel, the same as nonzero_zscore). Returns
// the normalisation of each channel.
std::vector<IntensityNorm> normalize_channels(
    std::vector<float>* voxels, int64_t channels);

}  // namespace memtrain
