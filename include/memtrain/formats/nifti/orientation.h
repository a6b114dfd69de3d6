#pragma once
// Reorientation of NIfTI grids to RAS+ (nibabel's io_orientation and
// as_closest_canonical: an axis permutation and flips, no interpolation),
// and the voxel-to-world transform of a resampled grid. Used by
// convert-dataset (every case stored in RAS) and predict (cases brought to
// RAS and back). No LibTorch, no NIfTI headers here.
//
// Axes: NIfTI voxel axes are (i, j, k); memtrain arrays are [C, D, H, W]
// = [C, k, j, i], i fastest. Shapes and spacings in this header are in
// (i, j, k) order unless a name says otherwise.

#include <array>
#include <cstdint>
#include <vector>

namespace memtrain {

// A 4x4 voxel-to-world transform, row-major: world (x, y, z, 1) = A (i, j,
// k, 1), x toward R, y toward A, z toward S (NIfTI's convention), mm.
using Affine = std::array<double, 16>;

Affine identity_affine();
// a * b.
Affine affine_product(const Affine& a, const Affine& b);

// For each voxel axis a (0 = i, 1 = j, 2 = k): the world axis it runs
// along most (0 = x, 1 = y, 2 = z) and flip[a] = -1 when it runs toward
// L, P or I (so that storing it reversed runs it toward R, A or S).
struct Orientation {
  std::array<int, 3> axis{0, 1, 2};
  std::array<int, 3> flip{1, 1, 1};
  bool identity() const;
};

// nibabel.orientations.io_orientation: the columns of the affine's 3x3
// part, normalised to unit length, are replaced by the closest orthogonal
// matrix (polar decomposition); voxel axes are then assigned in order
// i, j, k to the world axis of their largest component, that world axis
// being taken out of the running for the next ones. Throws memtrain::Error
// for a singular 3x3 part (no orientation).
Orientation io_orientation(const Affine& affine);

// The grid after reorientation: new axis o.axis[a] has shape[a] voxels
// (and spacing[a] mm).
std::array<int64_t, 3> reoriented_shape(
    const Orientation& o, const std::array<int64_t, 3>& shape);
std::array<double, 3> reoriented_spacing(
    const Orientation& o, const std::array<double, 3>& spacing);
// The transform of the reoriented grid of `shape` (the original grid):
// affine * M, where M maps a reoriented voxel index to the original one
// (nibabel's affine.dot(inv_ornt_aff(ornt, shape))).
Affine reoriented_affine(
    const Orientation& o,
    const Affine& affine,
    const std::array<int64_t, 3>& shape);

// Reorients `src`, memtrain order [C, D, H, W] of the original grid
// `shape` (i, j, k), to [C, D', H', W'] of the reoriented grid
// (nibabel.orientations.apply_orientation on each channel).
template <typename T>
std::vector<T> reorient(
    const std::vector<T>& src,
    int64_t channels,
    const std::array<int64_t, 3>& shape,
    const Orientation& o);
// The inverse: `src` on the reoriented grid back to the original grid
// `shape`. reorient_back(reorient(x)) == x.
template <typename T>
std::vector<T> reorient_back(
    const std::vector<T>& src,
    int64_t channels,
    const std::array<int64_t, 3>& shape,
    const Orientation& o);

// The transform of a grid of `m` voxels of spacing `to` resampled from
// `affine`'s grid of `n` voxels of spacing `from`, the two centred on each
// other as resample_linear does (nifti_volume.h): new voxel o is old voxel
// (n-1)/2 + (o - (m-1)/2) * to / from on each axis.
Affine resampled_affine(
    const Affine& affine,
    const std::array<int64_t, 3>& n,
    const std::array<double, 3>& from,
    const std::array<int64_t, 3>& m,
    const std::array<double, 3>& to);

}  // namespace memtrain
