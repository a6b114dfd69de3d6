// make-data --kind patch-features: what a frozen backbone's patch grid
// gives a segmentation head (docs/data-format.md, "Rows that belong to
// volumes"). Each of `volumes` volumes is a grid of grid^3 positions with a
// foreground blob; a row is one position: local features of its own class,
// context features summarising its 3x3x3 neighbourhood's classes, its label,
// its volume id and its (d, h, w) position.

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "data/h5/h5_util.h"
#include "data/h5/layout.h"
#include "data/synthetic/synthetic_util.h"
#include "memtrain/data/synthetic/synthetic.h"
#include "memtrain/util/error.h"

namespace memtrain::synthetic {
namespace {

// The class of position p of a grid with a blob of radius r at centre c:
// 0 outside; inside, classes-1 shells, the highest class at the core.
int64_t blob_class(
    const std::array<double, 3>& p,
    const std::array<double, 3>& c,
    double r,
    int64_t classes) {
  const double dz = p[0] - c[0], dy = p[1] - c[1], dx = p[2] - c[2];
  const double dist = std::sqrt(dz * dz + dy * dy + dx * dx);
  if (dist > r)
    return 0;
  const auto shell = static_cast<int64_t>((1.0 - dist / r) * (classes - 1));
  return 1 + std::min<int64_t>(shell, classes - 2);
}

}  // namespace

void make_patch_features(const SyntheticSpec& spec, const std::string& path) {
  const int64_t V = spec.volumes, G = spec.grid, F = spec.features,
                F2 = spec.context, K = spec.classes;
  MT_CHECK(V > 0, "make-data: --volumes must be positive");
  MT_CHECK(G > 0 && G <= 1024, "make-data: --grid must be in 1..1024");
  MT_CHECK(F > 0, "make-data: --features must be positive");
  MT_CHECK(F2 >= 0, "make-data: --context must be >= 0");
  const int64_t per = G * G * G;
  const int64_t n = V * per;
  MT_CHECK(
      n <= (int64_t{1} << 31),
      "make-data: --volumes x --grid^3 = ",
      n,
      " rows is too many");

  // The task, from the seed alone: a centre per class for the local
  // features and one for the context features, each N(0, 0.5^2) per
  // dimension (as --kind features).
  std::seed_seq task_seq{
      static_cast<uint32_t>(spec.seed),
      static_cast<uint32_t>(spec.seed >> 32),
      0x9a7cu};
  Gaussian task(task_seq);
  std::vector<double> mu(K * F), nu(K * F2);
  for (double& m : mu)
    m = 0.5 * task.next();
  for (double& m : nu)
    m = 0.5 * task.next();

  // The samples, from the seed and the split: per volume a blob (radius
  // 0.2-0.35 of the grid, inside it), then every position's rows.
  std::seed_seq sample_seq{
      static_cast<uint32_t>(spec.seed),
      static_cast<uint32_t>(spec.seed >> 32),
      hash_name(spec.split),
      0x9a7du};
  Gaussian gen(sample_seq);
  auto unit = [&] { return static_cast<double>(gen.raw() >> 11) * 0x1.0p-53; };
  std::vector<float> x(n * F), ctx(n * F2);
  std::vector<int64_t> labels(n);
  std::vector<int32_t> ids(n), voxel(3 * n);
  std::vector<int64_t> grid(per);
  for (int64_t v = 0; v < V; ++v) {
    const double r = G * (0.2 + 0.15 * unit());
    std::array<double, 3> c{};
    for (double& a : c)
      a = std::max(0.0, G - 1 - 2 * r) * unit() + std::min(r, (G - 1) / 2.0);
    for (int64_t i = 0; i < per; ++i) {
      const std::array<double, 3> p{
          double(i / (G * G)), double((i / G) % G), double(i % G)};
      grid[i] = blob_class(p, c, r, K);
    }
    for (int64_t i = 0; i < per; ++i) {
      const int64_t row = v * per + i;
      const int64_t d = i / (G * G), h = (i / G) % G, w = i % G;
      labels[row] = grid[i];
      ids[row] = static_cast<int32_t>(v);
      voxel[3 * row] = static_cast<int32_t>(d);
      voxel[3 * row + 1] = static_cast<int32_t>(h);
      voxel[3 * row + 2] = static_cast<int32_t>(w);
      for (int64_t j = 0; j < F; ++j) {
        x[row * F + j] =
            static_cast<float>(mu[grid[i] * F + j] + spec.noise * gen.next());
      }
      if (F2 == 0)
        continue;
      // Context: the class mix of the 3x3x3 neighbourhood (inside the
      // grid) through the context centres, under the same noise.
      std::vector<double> mix(K, 0.0);
      double count = 0;
      for (int64_t a = std::max<int64_t>(0, d - 1); a <= std::min(G - 1, d + 1);
           ++a)
        for (int64_t b = std::max<int64_t>(0, h - 1);
             b <= std::min(G - 1, h + 1);
             ++b)
          for (int64_t e = std::max<int64_t>(0, w - 1);
               e <= std::min(G - 1, w + 1);
               ++e) {
            mix[grid[(a * G + b) * G + e]] += 1;
            count += 1;
          }
      for (int64_t j = 0; j < F2; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k)
          s += mix[k] / count * nu[k * F2 + j];
        ctx[row * F2 + j] = static_cast<float>(s + spec.noise * gen.next());
      }
    }
  }
  if (spec.shuffle) {  // Fisher-Yates on the split's stream
    for (int64_t i = n - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(gen.raw() % uint64_t(i + 1));
      std::swap_ranges(&x[i * F], &x[i * F] + F, &x[j * F]);
      if (F2 > 0)
        std::swap_ranges(&ctx[i * F2], &ctx[i * F2] + F2, &ctx[j * F2]);
      std::swap(labels[i], labels[j]);
      std::swap(ids[i], ids[j]);
      std::swap_ranges(&voxel[3 * i], &voxel[3 * i] + 3, &voxel[3 * j]);
    }
  }

  write_file(path, [&](hid_t f) {
    const hsize_t rows = static_cast<hsize_t>(n);
    auto row_chunk = [&](int64_t width) {
      return std::min<hsize_t>(
          rows, std::max<hsize_t>(1, 65536 / static_cast<hsize_t>(width)));
    };
    h5::write_dataset(
        f,
        layout::kFeatures,
        H5T_IEEE_F32LE,
        H5T_NATIVE_FLOAT,
        {rows, hsize_t(F)},
        {row_chunk(F), hsize_t(F)},
        x.data());
    if (F2 > 0) {
      h5::write_dataset(
          f,
          layout::kContextFeatures,
          H5T_IEEE_F32LE,
          H5T_NATIVE_FLOAT,
          {rows, hsize_t(F2)},
          {row_chunk(F2), hsize_t(F2)},
          ctx.data());
    }
    const hsize_t chunk = std::min<hsize_t>(rows, 8192);
    h5::write_dataset(
        f,
        layout::kLabels,
        H5T_STD_I64LE,
        H5T_NATIVE_INT64,
        {rows},
        {chunk},
        labels.data());
    h5::write_dataset(
        f,
        layout::kVolumeIds,
        H5T_STD_I32LE,
        H5T_NATIVE_INT32,
        {rows},
        {chunk},
        ids.data());
    h5::write_dataset(
        f,
        layout::kVoxelIndex,
        H5T_STD_I32LE,
        H5T_NATIVE_INT32,
        {rows, 3},
        {chunk, 3},
        voxel.data());
    h5::write_attr(f, layout::kLayoutVersion, layout::kVersion);
    h5::write_attr(f, layout::kKind, std::string("features"));
    h5::write_attr(f, layout::kNumClasses, K);
    std::string names = "background";
    for (int64_t k = 1; k < K; ++k)
      names += ",blob" + std::to_string(k);
    h5::write_attr(f, layout::kClassNames, names);
    h5::write_attr(
        f,
        layout::kGenerator,
        std::string("memtrain make-data patch-features"));
    h5::write_attr(f, layout::kSeed, static_cast<int64_t>(spec.seed));
    h5::write_attr(f, layout::kSplit, spec.split);
    h5::write_attr(f, layout::kNoise, spec.noise);
    h5::write_attr(f, layout::kVolumeCount, V);
    h5::write_attr(f, layout::kGrid, G);
  });
}

}  // namespace memtrain::synthetic
