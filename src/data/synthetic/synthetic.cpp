#include "memtrain/data/synthetic/synthetic.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "data/h5/h5_util.h"
#include "data/h5/layout.h"
#include "data/synthetic/synthetic_util.h"
#include "memtrain/util/error.h"
#include "memtrain/util/temp_path.h"

namespace memtrain {
namespace synthetic {

uint32_t hash_name(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s)
    h = (h ^ c) * 16777619u;
  return h;
}

void write_file(
    const std::string& path, const std::function<void(hid_t)>& fill) {
  remove_stale_temp_files(path);
  const std::string tmp = temp_path_for(path);
  try {
    h5::Handle file = h5::create_file(tmp, "make-data");
    fill(file.get());
    h5::finish_file(&file, "make-data");
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error("make-data: cannot move '" + tmp + "' to '" + path + "'");
  }
}

void write_rows(
    hid_t f, const char* name, int64_t rows, int64_t width, const float* data) {
  const hsize_t n = static_cast<hsize_t>(rows);
  const hsize_t w = static_cast<hsize_t>(width);
  h5::write_dataset(
      f,
      name,
      H5T_IEEE_F32LE,
      H5T_NATIVE_FLOAT,
      {n, w},
      {std::min<hsize_t>(n, std::max<hsize_t>(1, 65536 / w)), w},
      data);
}

}  // namespace synthetic

namespace {

using synthetic::Gaussian;
using synthetic::hash_name;
using synthetic::write_file;

// Volumes: each has classes-1 spheres (class c = the c-th sphere, later ones
// drawn over earlier ones) on background 0; every class has its own mean
// intensity per channel, under Gaussian noise. Sphere positions and sizes
// come from the split's draws; class intensities from the task seed.
void make_volumes(const SyntheticSpec& spec, const std::string& path) {
  MT_CHECK(
      spec.dtype == "float32" || spec.dtype == "uint8" || spec.dtype == "int16",
      "make-data: --dtype '",
      spec.dtype,
      "' is not float32, uint8 or int16 for volumes");
  MT_CHECK(spec.chunk >= 0, "make-data: --chunk must be >= 0");
  const int64_t C = spec.channels, D = spec.depth, H = spec.height,
                W = spec.width;
  MT_CHECK(
      C > 0 && D > 0 && H > 0 && W > 0,
      "make-data: volume shape must be positive");
  const int64_t voxels = D * H * W;
  std::seed_seq task_seq{
      static_cast<uint32_t>(spec.seed),
      static_cast<uint32_t>(spec.seed >> 32),
      0x701u};
  Gaussian task(task_seq);
  std::vector<double> means(spec.classes * C);
  for (auto& m : means)
    m = 1.5 * task.next();
  std::seed_seq sample_seq{
      static_cast<uint32_t>(spec.seed),
      static_cast<uint32_t>(spec.seed >> 32),
      hash_name(spec.split)};
  Gaussian gen(sample_seq);
  auto unit = [&] { return static_cast<double>(gen.raw() >> 11) * 0x1.0p-53; };
  // Each case's own (d, h, w): the whole array, or with --ragged 50-100%
  // of it on each axis (case 0 whole, so that the array is the largest).
  std::vector<std::array<int64_t, 3>> extents(spec.samples, {D, H, W});
  if (spec.ragged) {
    std::seed_seq ragged_seq{
        static_cast<uint32_t>(spec.seed),
        static_cast<uint32_t>(spec.seed >> 32),
        hash_name(spec.split),
        0x7a66u};
    Gaussian shapes(ragged_seq);
    for (int64_t n = 1; n < spec.samples; ++n) {
      for (int a = 0; a < 3; ++a) {
        const double u = static_cast<double>(shapes.raw() >> 11) * 0x1.0p-53;
        extents[n][a] =
            std::max<int64_t>(1, std::llround(extents[n][a] * (0.5 + 0.5 * u)));
      }
    }
  }
  std::vector<uint8_t> masks(spec.samples * voxels, 0);
  std::vector<float> x(spec.samples * C * voxels, 0.0f);
  for (int64_t n = 0; n < spec.samples; ++n) {
    const auto& e = extents[n];
    const double min_dim = static_cast<double>(std::min({e[0], e[1], e[2]}));
    uint8_t* m = masks.data() + n * voxels;
    for (int64_t c = 1; c < spec.classes; ++c) {
      const double r = min_dim * (0.15 + 0.15 * unit());
      const double cz = r + (e[0] - 2 * r) * unit();
      const double cy = r + (e[1] - 2 * r) * unit();
      const double cx = r + (e[2] - 2 * r) * unit();
      for (int64_t z = 0; z < e[0]; ++z)
        for (int64_t y = 0; y < e[1]; ++y)
          for (int64_t xx = 0; xx < e[2]; ++xx) {
            const double dz = z - cz, dy = y - cy, dx = xx - cx;
            if (dz * dz + dy * dy + dx * dx <= r * r)
              m[(z * H + y) * W + xx] = static_cast<uint8_t>(c);
          }
    }
    for (int64_t ch = 0; ch < C; ++ch) {
      float* p = x.data() + (n * C + ch) * voxels;
      for (int64_t z = 0; z < e[0]; ++z)
        for (int64_t y = 0; y < e[1]; ++y)
          for (int64_t xx = 0; xx < e[2]; ++xx) {
            const int64_t i = (z * H + y) * W + xx;
            p[i] = static_cast<float>(
                means[m[i] * C + ch] + spec.noise * gen.next());
          }
    }
  }
  write_file(path, [&](hid_t f) {
    const hsize_t n = static_cast<hsize_t>(spec.samples);
    const std::vector<hsize_t> dims = {
        n, hsize_t(C), hsize_t(D), hsize_t(H), hsize_t(W)};
    // Edge `--chunk` (0: the whole volume, one chunk per volume).
    auto edge = [&](int64_t n) {
      return static_cast<hsize_t>(spec.chunk > 0 ? std::min(spec.chunk, n) : n);
    };
    const std::vector<hsize_t> chunk = {
        1, hsize_t(C), edge(D), edge(H), edge(W)};
    const std::vector<hsize_t> mchunk = {1, chunk[2], chunk[3], chunk[4]};
    if (spec.dtype == "float32") {
      h5::write_dataset(
          f,
          layout::kVolumes,
          H5T_IEEE_F32LE,
          H5T_NATIVE_FLOAT,
          dims,
          chunk,
          x.data());
    } else {
      // Quantised: x = q * scale + shift (the reader undoes it).
      const bool u8 = spec.dtype == "uint8";
      const double scale = u8 ? 1.0 / 16.0 : 1.0 / 1000.0;
      const double shift = u8 ? -8.0 : 0.0;
      std::vector<int16_t> q(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        const double v = std::round((x[i] - shift) / scale);
        q[i] = static_cast<int16_t>(
            u8 ? std::clamp(v, 0.0, 255.0) : std::clamp(v, -32768.0, 32767.0));
      }
      h5::write_dataset(
          f,
          layout::kVolumes,
          u8 ? H5T_STD_U8LE : H5T_STD_I16LE,
          H5T_NATIVE_INT16,
          dims,
          chunk,
          q.data());
      h5::Handle ds = h5::dataset(H5Dopen2(f, layout::kVolumes, H5P_DEFAULT));
      h5::write_attr(ds.get(), layout::kScale, scale);
      h5::write_attr(ds.get(), layout::kShift, shift);
    }
    h5::write_dataset(
        f,
        layout::kMasks,
        H5T_STD_U8LE,
        H5T_NATIVE_UINT8,
        {n, hsize_t(D), hsize_t(H), hsize_t(W)},
        mchunk,
        masks.data());
    if (spec.ragged) {
      std::vector<int64_t> shapes;
      for (const auto& e : extents)
        shapes.insert(shapes.end(), e.begin(), e.end());
      h5::write_dataset(
          f,
          layout::kVolumeShapes,
          H5T_STD_I64LE,
          H5T_NATIVE_INT64,
          {n, 3},
          {},
          shapes.data());
    }
    h5::write_attr(f, layout::kLayoutVersion, layout::kVersion);
    h5::write_attr(f, layout::kKind, std::string("volumes"));
    h5::write_attr(f, layout::kNumClasses, spec.classes);
    std::string names = "background";
    for (int64_t c = 1; c < spec.classes; ++c)
      names += ",sphere" + std::to_string(c);
    h5::write_attr(f, layout::kClassNames, names);
    h5::write_attr(f, layout::kGenerator, std::string("memtrain make-data"));
    h5::write_attr(f, layout::kSeed, static_cast<int64_t>(spec.seed));
    h5::write_attr(f, layout::kSplit, spec.split);
    h5::write_attr(f, layout::kNoise, spec.noise);
  });
}

// Few-shot: `classes` classes of samples / classes rows each (row i is of
// class i mod classes). A class is a point on a sphere in an 8-dimensional
// latent space, seen through a random linear map into F features, under
// isotropic noise and a strong nuisance in 4 other random directions: raw
// distances are dominated by the nuisance, so an embedding that learns to
// suppress it (on the training classes) transfers to unseen classes.
void make_fewshot(const SyntheticSpec& spec, const std::string& path) {
  const int64_t f = spec.features, d = std::min<int64_t>(8, f), u = 4;
  const int64_t per_class = spec.samples / spec.classes;
  MT_CHECK(
      per_class >= 2,
      "make-data --kind fewshot: --samples ",
      spec.samples,
      " gives fewer than 2 samples per class for ",
      spec.classes,
      " classes");
  std::seed_seq task_seq{
      static_cast<uint32_t>(spec.seed),
      static_cast<uint32_t>(spec.seed >> 32),
      0xf5u};
  Gaussian task(task_seq);
  std::vector<double> a(f * d), b(f * u), centre(spec.classes * d);
  for (double& v : a)
    v = task.next() / std::sqrt(static_cast<double>(d));
  for (double& v : b)
    v = task.next();
  for (int64_t c = 0; c < spec.classes; ++c) {
    double norm = 0;
    for (int64_t k = 0; k < d; ++k) {
      centre[c * d + k] = task.next();
      norm += centre[c * d + k] * centre[c * d + k];
    }
    for (int64_t k = 0; k < d; ++k)
      centre[c * d + k] *= 3.0 / std::sqrt(norm);  // radius 3
  }
  std::seed_seq sample_seq{
      static_cast<uint32_t>(spec.seed),
      static_cast<uint32_t>(spec.seed >> 32),
      hash_name(spec.split)};
  Gaussian gen(sample_seq);
  const int64_t n = per_class * spec.classes;
  std::vector<int64_t> labels(n);
  std::vector<float> x(n * f);
  std::vector<double> z(d), w(u);
  for (int64_t i = 0; i < n; ++i) {
    labels[i] = i % spec.classes;
    for (int64_t k = 0; k < d; ++k)
      z[k] = centre[labels[i] * d + k] + 0.5 * gen.next();
    for (int64_t k = 0; k < u; ++k)
      w[k] = 2.0 * gen.next();
    for (int64_t j = 0; j < f; ++j) {
      double v = spec.noise * 0.3 * gen.next();
      for (int64_t k = 0; k < d; ++k)
        v += a[j * d + k] * z[k];
      for (int64_t k = 0; k < u; ++k)
        v += b[j * u + k] * w[k];
      x[i * f + j] = static_cast<float>(v);
    }
  }
  write_file(path, [&](hid_t file) {
    const hsize_t rows = static_cast<hsize_t>(n), fdim = f;
    h5::write_dataset(
        file,
        layout::kFeatures,
        H5T_IEEE_F32LE,
        H5T_NATIVE_FLOAT,
        {rows, fdim},
        {std::min<hsize_t>(rows, std::max<hsize_t>(1, 65536 / fdim)), fdim},
        x.data());
    h5::write_dataset(
        file,
        layout::kLabels,
        H5T_STD_I64LE,
        H5T_NATIVE_INT64,
        {rows},
        {std::min<hsize_t>(rows, 8192)},
        labels.data());
    h5::write_attr(file, layout::kLayoutVersion, layout::kVersion);
    h5::write_attr(file, layout::kKind, std::string("features"));
    h5::write_attr(file, layout::kNumClasses, spec.classes);
    h5::write_attr(
        file, layout::kGenerator, std::string("memtrain make-data fewshot"));
    h5::write_attr(file, layout::kSeed, static_cast<int64_t>(spec.seed));
    h5::write_attr(file, layout::kSplit, spec.split);
    h5::write_attr(file, layout::kNoise, spec.noise);
  });
}

}  // namespace

void make_synthetic(const SyntheticSpec& spec, const std::string& path) {
  h5::silence_errors();
  MT_CHECK(
      spec.kind == "features" || spec.kind == "images" ||
          spec.kind == "volumes" || spec.kind == "fewshot" ||
          spec.kind == "patch-features" || spec.kind == "pairs" ||
          spec.kind == "captions" || spec.kind == "regression",
      "make-data: --kind '",
      spec.kind,
      "' is not features, images, volumes, fewshot, patch-features, pairs, "
      "captions or regression");
  MT_CHECK(spec.samples > 0, "make-data: --samples must be positive");
  MT_CHECK(spec.classes >= 2, "make-data: --classes must be at least 2");
  MT_CHECK(spec.noise >= 0, "make-data: --noise must be >= 0");
  if (spec.kind == "volumes") {
    make_volumes(spec, path);
    return;
  }
  if (spec.kind == "fewshot") {
    make_fewshot(spec, path);
    return;
  }
  if (spec.kind == "pairs") {
    synthetic::make_pairs(spec, path);
    return;
  }
  if (spec.kind == "captions") {
    synthetic::make_captions(spec, path);
    return;
  }
  if (spec.kind == "patch-features") {
    synthetic::make_patch_features(spec, path);
    return;
  }
  if (spec.kind == "regression") {
    synthetic::make_regression(spec, path);
    return;
  }
  MT_CHECK(
      spec.dtype == "float32" || spec.dtype == "uint8",
      "make-data: --dtype '",
      spec.dtype,
      "' is not float32 or uint8");
  MT_CHECK(
      spec.context == 0 || spec.kind == "features",
      "make-data: --context applies to --kind features only");
  const bool features = spec.kind == "features";
  MT_CHECK(
      !features || spec.dtype == "float32",
      "make-data: --dtype uint8 applies to --kind images only");
  const int64_t numel =
      features ? spec.features : spec.channels * spec.height * spec.width;
  MT_CHECK(numel > 0, "make-data: sample shape must be positive");

  // The task: one centre (or image template) per class, from the seed alone.
  std::seed_seq task_seq{
      static_cast<uint32_t>(spec.seed),
      static_cast<uint32_t>(spec.seed >> 32),
      0x7a5cu};
  Gaussian task(task_seq);
  // Class centres drawn N(0, 0.5^2) per dimension under N(0, noise^2) noise:
  // a single dimension barely separates classes, all of them together do,
  // so a model has something to learn over a few epochs.
  std::vector<float> centres(spec.classes * numel);
  for (float& c : centres)
    c = static_cast<float>(0.5 * task.next());
  if (!features) {
    // Images also get a per-class, per-channel intensity offset: a signal
    // that survives a CNN's global average pooling, as colour does.
    const int64_t plane = spec.height * spec.width;
    for (int64_t c = 0; c < spec.classes; ++c) {
      for (int64_t ch = 0; ch < spec.channels; ++ch) {
        const float offset = static_cast<float>(0.7 * task.next());
        float* p = centres.data() + c * numel + ch * plane;
        for (int64_t k = 0; k < plane; ++k)
          p[k] += offset;
      }
    }
  }

  std::seed_seq sample_seq{
      static_cast<uint32_t>(spec.seed),
      static_cast<uint32_t>(spec.seed >> 32),
      hash_name(spec.split)};
  Gaussian gen(sample_seq);
  std::vector<int64_t> labels(spec.samples);
  std::vector<float> x(spec.samples * numel);
  for (int64_t i = 0; i < spec.samples; ++i) {
    labels[i] = static_cast<int64_t>(gen.raw() % spec.classes);
    const float* c = centres.data() + labels[i] * numel;
    for (int64_t j = 0; j < numel; ++j) {
      x[i * numel + j] = c[j] + static_cast<float>(spec.noise * gen.next());
    }
  }

  // Context features: a second view of the same class, with its own centres
  // (from the task seed) and noise.
  std::vector<float> ctx;
  if (spec.context > 0) {
    std::vector<float> ctx_centres(spec.classes * spec.context);
    for (float& c : ctx_centres)
      c = static_cast<float>(0.5 * task.next());
    ctx.resize(spec.samples * spec.context);
    for (int64_t i = 0; i < spec.samples; ++i) {
      for (int64_t j = 0; j < spec.context; ++j) {
        ctx[i * spec.context + j] = ctx_centres[labels[i] * spec.context + j] +
                                    static_cast<float>(spec.noise * gen.next());
      }
    }
  }

  write_file(path, [&](hid_t f) {
    const hsize_t n = static_cast<hsize_t>(spec.samples);
    if (features) {
      const hsize_t fdim = static_cast<hsize_t>(spec.features);
      h5::write_dataset(
          f,
          layout::kFeatures,
          H5T_IEEE_F32LE,
          H5T_NATIVE_FLOAT,
          {n, fdim},
          {std::min<hsize_t>(n, std::max<hsize_t>(1, 65536 / fdim)), fdim},
          x.data());
      if (!ctx.empty()) {
        const hsize_t cdim = static_cast<hsize_t>(spec.context);
        h5::write_dataset(
            f,
            layout::kContextFeatures,
            H5T_IEEE_F32LE,
            H5T_NATIVE_FLOAT,
            {n, cdim},
            {std::min<hsize_t>(n, std::max<hsize_t>(1, 65536 / cdim)), cdim},
            ctx.data());
      }
    } else {
      const std::vector<hsize_t> dims = {
          n,
          static_cast<hsize_t>(spec.channels),
          static_cast<hsize_t>(spec.height),
          static_cast<hsize_t>(spec.width)};
      // One sample a chunk (DESIGN.md): a random read touches one chunk.
      const std::vector<hsize_t> chunk = {1, dims[1], dims[2], dims[3]};
      if (spec.dtype == "uint8") {
        std::vector<uint8_t> q(x.size());
        for (size_t i = 0; i < x.size(); ++i) {
          const double v = std::round(128.0 + 32.0 * x[i]);
          q[i] = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
        }
        h5::write_dataset(
            f,
            layout::kImages,
            H5T_STD_U8LE,
            H5T_NATIVE_UINT8,
            dims,
            chunk,
            q.data());
        h5::Handle ds = h5::dataset(H5Dopen2(f, layout::kImages, H5P_DEFAULT));
        // Undo the quantisation: x = (q - 128) / 32.
        h5::write_attr(ds.get(), layout::kScale, 1.0 / 32.0);
        h5::write_attr(ds.get(), layout::kShift, -4.0);
      } else {
        h5::write_dataset(
            f,
            layout::kImages,
            H5T_IEEE_F32LE,
            H5T_NATIVE_FLOAT,
            dims,
            chunk,
            x.data());
      }
    }
    h5::write_dataset(
        f,
        layout::kLabels,
        H5T_STD_I64LE,
        H5T_NATIVE_INT64,
        {n},
        {std::min<hsize_t>(n, 8192)},
        labels.data());
    h5::write_attr(f, layout::kLayoutVersion, layout::kVersion);
    h5::write_attr(f, layout::kKind, spec.kind);
    h5::write_attr(f, layout::kNumClasses, spec.classes);
    std::string names;
    for (int64_t c = 0; c < spec.classes; ++c) {
      names += (c ? "," : "") + std::string("class") + std::to_string(c);
    }
    h5::write_attr(f, layout::kClassNames, names);
    h5::write_attr(f, layout::kGenerator, std::string("memtrain make-data"));
    h5::write_attr(f, layout::kSeed, static_cast<int64_t>(spec.seed));
    h5::write_attr(f, layout::kSplit, spec.split);
    h5::write_attr(f, layout::kNoise, spec.noise);
  });
}

}  // namespace memtrain
