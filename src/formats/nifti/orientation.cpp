#include "memtrain/formats/nifti/orientation.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "memtrain/util/error.h"

namespace memtrain {
namespace {

using M3 = std::array<std::array<double, 3>, 3>;

double det3(const M3& a) {
  return a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1]) -
         a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0]) +
         a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]);
}

// The inverse transposed, (a^-1)^T = cofactor(a) / det(a).
M3 inverse_transpose(const M3& a, double det) {
  M3 c{};
  for (int r = 0; r < 3; ++r)
    for (int k = 0; k < 3; ++k) {
      const int r1 = (r + 1) % 3, r2 = (r + 2) % 3;
      const int k1 = (k + 1) % 3, k2 = (k + 2) % 3;
      c[r][k] = (a[r1][k1] * a[r2][k2] - a[r1][k2] * a[r2][k1]) / det;
    }
  return c;
}

// The orthogonal factor of the polar decomposition a = Q P (Q = U V^T of
// the SVD, what nibabel computes), by Newton's iteration Q <- (Q + Q^-T)/2,
// which converges quadratically for any non-singular a.
M3 orthogonal_factor(M3 q) {
  for (int it = 0; it < 100; ++it) {
    const double d = det3(q);
    const M3 qi = inverse_transpose(q, d);
    double change = 0;
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 3; ++c) {
        const double v = 0.5 * (q[r][c] + qi[r][c]);
        change = std::max(change, std::fabs(v - q[r][c]));
        q[r][c] = v;
      }
    if (change < 1e-15)
      break;
  }
  return q;
}

// Calls f(old linear index, new linear index) for every voxel of one
// channel of the original grid `shape` under `o`.
template <typename F>
void for_each_voxel(
    const std::array<int64_t, 3>& shape, const Orientation& o, F&& f) {
  const std::array<int64_t, 3> ns = reoriented_shape(o, shape);
  // new linear index = sum over new axes b of n[b] * stride[b].
  const std::array<int64_t, 3> stride = {1, ns[0], ns[0] * ns[1]};
  // Old axis a moves along new axis o.axis[a]: its step and start there.
  std::array<int64_t, 3> step{}, start{};
  for (int a = 0; a < 3; ++a) {
    const int64_t s = stride[o.axis[a]];
    step[a] = o.flip[a] < 0 ? -s : s;
    start[a] = o.flip[a] < 0 ? (shape[a] - 1) * s : 0;
  }
  int64_t old = 0;
  for (int64_t k = 0; k < shape[2]; ++k) {
    const int64_t nk = start[2] + k * step[2];
    for (int64_t j = 0; j < shape[1]; ++j) {
      const int64_t nj = nk + start[1] + j * step[1];
      for (int64_t i = 0; i < shape[0]; ++i)
        f(old++, nj + start[0] + i * step[0]);
    }
  }
}

}  // namespace

Affine identity_affine() {
  return {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
}

Affine affine_product(const Affine& a, const Affine& b) {
  Affine c{};
  for (int r = 0; r < 4; ++r)
    for (int k = 0; k < 4; ++k) {
      double s = 0;
      for (int m = 0; m < 4; ++m)
        s += a[r * 4 + m] * b[m * 4 + k];
      c[r * 4 + k] = s;
    }
  return c;
}

bool Orientation::identity() const {
  for (int a = 0; a < 3; ++a)
    if (axis[a] != a || flip[a] != 1)
      return false;
  return true;
}

Orientation io_orientation(const Affine& affine) {
  M3 rs{};
  for (int c = 0; c < 3; ++c) {
    double norm = 0;
    for (int r = 0; r < 3; ++r)
      norm += affine[r * 4 + c] * affine[r * 4 + c];
    norm = std::sqrt(norm);
    if (norm == 0)
      norm = 1;  // as nibabel: a zero column stays zero
    for (int r = 0; r < 3; ++r)
      rs[r][c] = affine[r * 4 + c] / norm;
  }
  MT_CHECK(
      std::fabs(det3(rs)) > 1e-6 && std::isfinite(det3(rs)),
      "the voxel-to-world transform is singular (its 3x3 part has rank < "
      "3): no orientation");
  M3 q = orthogonal_factor(rs);
  Orientation o;
  for (int a = 0; a < 3; ++a) {
    int best = 0;
    for (int r = 1; r < 3; ++r)
      if (std::fabs(q[r][a]) > std::fabs(q[best][a]))
        best = r;
    MT_CHECK(
        std::fabs(q[best][a]) > 1e-8,
        "the voxel-to-world transform gives voxel axis ",
        a,
        " no world axis: no orientation");
    o.axis[a] = best;
    o.flip[a] = q[best][a] < 0 ? -1 : 1;
    for (int c = 0; c < 3; ++c)
      q[best][c] = 0;
  }
  return o;
}

std::array<int64_t, 3> reoriented_shape(
    const Orientation& o, const std::array<int64_t, 3>& shape) {
  std::array<int64_t, 3> s{};
  for (int a = 0; a < 3; ++a)
    s[o.axis[a]] = shape[a];
  return s;
}

std::array<double, 3> reoriented_spacing(
    const Orientation& o, const std::array<double, 3>& spacing) {
  std::array<double, 3> s{};
  for (int a = 0; a < 3; ++a)
    s[o.axis[a]] = spacing[a];
  return s;
}

Affine reoriented_affine(
    const Orientation& o,
    const Affine& affine,
    const std::array<int64_t, 3>& shape) {
  // Old index a = flip[a] * new index axis[a] + (flip < 0 ? shape[a]-1 : 0).
  Affine m{};
  for (int a = 0; a < 3; ++a) {
    m[a * 4 + o.axis[a]] = o.flip[a];
    m[a * 4 + 3] = o.flip[a] < 0 ? static_cast<double>(shape[a] - 1) : 0.0;
  }
  m[15] = 1;
  return affine_product(affine, m);
}

namespace {

// The voxels of `src` (channels x shape) moved by `o`: to the reoriented
// grid, or (`back`) from it.
template <typename T>
std::vector<T> move_voxels(
    const std::vector<T>& src,
    int64_t channels,
    const std::array<int64_t, 3>& shape,
    const Orientation& o,
    bool back) {
  const size_t plane = static_cast<size_t>(shape[0] * shape[1] * shape[2]);
  MT_INTERNAL_ASSERT(src.size() == plane * static_cast<size_t>(channels));
  if (o.identity())
    return src;
  std::vector<T> dst(src.size());
  for (int64_t c = 0; c < channels; ++c) {
    const T* s = src.data() + c * plane;
    T* d = dst.data() + c * plane;
    for_each_voxel(shape, o, [&](int64_t old, int64_t now) {
      if (back)
        d[old] = s[now];
      else
        d[now] = s[old];
    });
  }
  return dst;
}

}  // namespace

template <typename T>
std::vector<T> reorient(
    const std::vector<T>& src,
    int64_t channels,
    const std::array<int64_t, 3>& shape,
    const Orientation& o) {
  return move_voxels(src, channels, shape, o, /*back=*/false);
}

template <typename T>
std::vector<T> reorient_back(
    const std::vector<T>& src,
    int64_t channels,
    const std::array<int64_t, 3>& shape,
    const Orientation& o) {
  return move_voxels(src, channels, shape, o, /*back=*/true);
}

template std::vector<float> reorient(
    const std::vector<float>&,
    int64_t,
    const std::array<int64_t, 3>&,
    const Orientation&);
template std::vector<uint8_t> reorient(
    const std::vector<uint8_t>&,
    int64_t,
    const std::array<int64_t, 3>&,
    const Orientation&);
template std::vector<float> reorient_back(
    const std::vector<float>&,
    int64_t,
    const std::array<int64_t, 3>&,
    const Orientation&);
template std::vector<uint8_t> reorient_back(
    const std::vector<uint8_t>&,
    int64_t,
    const std::array<int64_t, 3>&,
    const Orientation&);

Affine resampled_affine(
    const Affine& affine,
    const std::array<int64_t, 3>& n,
    const std::array<double, 3>& from,
    const std::array<int64_t, 3>& m,
    const std::array<double, 3>& to) {
  Affine s{};
  for (int a = 0; a < 3; ++a) {
    const double r = to[a] / from[a];
    s[a * 4 + a] = r;
    s[a * 4 + 3] = (n[a] - 1) / 2.0 - (m[a] - 1) / 2.0 * r;
  }
  s[15] = 1;
  return affine_product(affine, s);
}

}  // namespace memtrain
