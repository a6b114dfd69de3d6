#pragma once
// Private to src/data/h5/: what an open H5Dataset holds. Shared by
// h5_dataset.cpp (the layout of docs/data-format.md) and h5_pairs.cpp (pairs).
#include <cstdint>
#include <string>
#include <vector>

#include "data/h5/h5_util.h"
#include "memtrain/data/h5/h5_dataset.h"

namespace memtrain {

struct H5Dataset::Impl {
  h5::Handle file;
  h5::Handle samples;
  h5::Handle labels;   // /labels, /masks for volumes, /pair_ids for pairs
  h5::Handle context;  // /context_features (optional), /features_b of pairs
  h5::Handle targets;  // /targets of regression files
  // x = raw * scale + shift, for integer-typed sample datasets (and any
  // volumes with the attributes or data.intensity_*).
  bool normalise = false;
  double scale = 1.0;
  double shift = 0.0;
  std::vector<std::vector<int64_t>> foreground;  // volumes

  // DatasetInfo::checksummed / unchecksummed and chunk_cache_bytes from
  // the open datasets.
  void note_datasets(DatasetInfo& info) const {
    info.chunk_cache_bytes = 0;
    for (const h5::Handle* ds : {&samples, &labels, &context, &targets}) {
      if (!ds->valid())
        continue;
      if (!h5::has_fletcher32(ds->get()))
        info.unchecksummed.push_back(h5::object_name(ds->get()));
      info.chunk_cache_bytes += h5::chunk_cache_bound(ds->get());
    }
    info.checksummed = info.unchecksummed.empty();
  }

  void apply_normalisation(float* x, int64_t n) const {
    if (!normalise)
      return;
    const float s = static_cast<float>(scale);
    const float t = static_cast<float>(shift);
    for (int64_t i = 0; i < n; ++i)
      x[i] = x[i] * s + t;
  }
};

// A float table with one row per sample beside the sample dataset
// (/context_features, /features_b, /targets): `name` of file `f` opened
// into `into` and checked -- 2-D [N, `width`] with the samples' N and a
// float type (an integer type when `integers`: /tokens) -- its width
// returned. `why` ends the row-count message.
int64_t open_row_table(
    h5::Handle& into,
    hid_t f,
    const char* name,
    const std::string& where,
    const DatasetInfo& info,
    const char* width,
    const char* why,
    hid_t dapl = H5P_DEFAULT,
    bool integers = false);

}  // namespace memtrain
