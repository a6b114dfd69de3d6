#include "memtrain/data/sampling/episodes.h"

#include <algorithm>
#include <cmath>

#include "memtrain/util/error.h"

namespace memtrain {

// Note [Episodes]
// In episodic mode (data.episodes.n_way > 0) the unit of the sampler, of a
// micro-batch and of Note [Window weighting] is a whole episode: sample i of
// epoch e is episode (e, i), so an episode is never cut across micro-steps
// or ranks, and a window of E episodes gives one step on their mean query
// loss for any split. An episode is drawn from (data.seed, stream, epoch,
// index) alone -- stream 0: training, 1: validation (epoch 0: the same
// episodes at every validation), 2: the class split -- with SplitMix64
// (our own, so no standard library's distributions are involved):
//   G = 0x9E3779B97F4A7C15, mix(z) = SplitMix64's finaliser
//   h = mix(seed + G); h = mix(h + stream + G); h = mix(h + epoch + G);
//   state = mix(h + index + G);  next() = mix(state += G)
//   below(n) = next() % n, redrawn while next() >= 2^64-1 - (2^64-1) % n
//   draw_distinct(items, m): for i < m: swap(items[i], items[i +
//     below(len - i)]); the first m items.
// The episode: classes = draw_distinct(training classes ascending, n_way);
// then, per class in that order, draw_distinct(its rows ascending,
// k_shot + n_query): the first k_shot are its support, the rest its
// queries. Rows are laid out support class-major, then queries
// class-major, and class j of the episode is label j.
// The class split by fraction: draw_distinct(0..C-1, C) with stream 2,
// epoch 0, index 0; the first max(1, round(fraction x C)) are the
// validation classes.

namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

EpisodeRng::EpisodeRng(
    uint64_t seed, uint64_t stream, int64_t epoch, int64_t index) {
  uint64_t h = mix(seed + kGolden);
  h = mix(h + stream + kGolden);
  h = mix(h + static_cast<uint64_t>(epoch) + kGolden);
  state_ = mix(h + static_cast<uint64_t>(index) + kGolden);
}

uint64_t EpisodeRng::next() {
  state_ += kGolden;
  return mix(state_);
}

uint64_t EpisodeRng::below(uint64_t bound) {
  MT_INTERNAL_ASSERT(bound > 0);
  const uint64_t limit = UINT64_MAX - (UINT64_MAX % bound);
  uint64_t r;
  do {
    r = next();
  } while (r >= limit);
  return r % bound;
}

std::vector<int64_t> draw_distinct(
    std::vector<int64_t> items, int64_t m, EpisodeRng& rng) {
  const int64_t n = static_cast<int64_t>(items.size());
  MT_INTERNAL_ASSERT(m >= 0 && m <= n);
  for (int64_t i = 0; i < m; ++i) {
    const int64_t j =
        i + static_cast<int64_t>(rng.below(static_cast<uint64_t>(n - i)));
    std::swap(items[i], items[j]);
  }
  items.resize(m);
  return items;
}

std::string ClassRows::describe(int64_t c) const {
  std::string s = "class " + std::to_string(c);
  if (c < static_cast<int64_t>(names.size()) && !names[c].empty())
    s += " ('" + names[c] + "')";
  return s;
}

ClassRows ClassRows::from_labels(
    const std::vector<int64_t>& row_labels,
    int64_t num_classes,
    std::vector<std::string> names) {
  ClassRows out;
  out.rows.resize(num_classes);
  for (size_t r = 0; r < row_labels.size(); ++r)
    out.rows.at(row_labels[r]).push_back(static_cast<int64_t>(r));
  out.names = std::move(names);
  return out;
}

ClassSplit split_classes(
    const ClassRows& classes,
    const std::vector<int64_t>& val_ids,
    double fraction,
    uint64_t seed,
    const EpisodeShape& shape,
    bool need_val,
    const std::string& source) {
  const int64_t num = static_cast<int64_t>(classes.rows.size());
  ClassSplit split;
  std::vector<char> is_val(num, 0);
  if (!val_ids.empty()) {
    for (int64_t c : val_ids) {
      MT_CHECK(
          c >= 0 && c < num,
          "data.val_classes: class ",
          c,
          " is not a class of ",
          source,
          ", which has classes 0..",
          num - 1);
      MT_CHECK(!is_val[c], "data.val_classes: class ", c, " is listed twice");
      is_val[c] = 1;
    }
  } else {
    std::vector<int64_t> all(num);
    for (int64_t c = 0; c < num; ++c)
      all[c] = c;
    EpisodeRng rng(seed, 2, 0, 0);
    const std::vector<int64_t> perm = draw_distinct(all, num, rng);
    const int64_t m =
        std::max<int64_t>(1, std::llround(fraction * static_cast<double>(num)));
    for (int64_t i = 0; i < std::min(m, num); ++i)
      is_val[perm[i]] = 1;
  }
  for (int64_t c = 0; c < num; ++c)
    (is_val[c] ? split.val : split.train).push_back(c);
  // Few-shot evaluation is on classes never trained on.
  for (int64_t c : split.val) {
    MT_INTERNAL_ASSERT(
        !std::binary_search(split.train.begin(), split.train.end(), c),
        "training and validation classes overlap");
  }
  const auto enough = [&](const std::vector<int64_t>& set, const char* what) {
    MT_CHECK(
        static_cast<int64_t>(set.size()) >= shape.n_way,
        "data.episodes.n_way=",
        shape.n_way,
        " but ",
        source,
        " has only ",
        set.size(),
        " ",
        what,
        " class(es) of ",
        num,
        " (data.val_classes decides the split); lower n_way or move "
        "classes between the sets");
    for (int64_t c : set) {
      const int64_t have = static_cast<int64_t>(classes.rows[c].size());
      MT_CHECK(
          have >= shape.per_class(),
          source,
          ": ",
          classes.describe(c),
          " (a ",
          what,
          " class) has ",
          have,
          " sample(s), fewer than data.episodes.k_shot + n_query = ",
          shape.k_shot,
          " + ",
          shape.n_query,
          " = ",
          shape.per_class(),
          " that an episode takes from each class; lower n_query or "
          "k_shot, or remove the class from the file");
    }
  };
  enough(split.train, "training");
  if (need_val)
    enough(split.val, "validation");
  return split;
}

EpisodeSampler::EpisodeSampler(
    const ClassRows& rows,
    std::vector<int64_t> classes,
    EpisodeShape shape,
    uint64_t seed,
    uint64_t stream)
    : rows_(rows),
      classes_(std::move(classes)),
      shape_(shape),
      seed_(seed),
      stream_(stream) {
  std::sort(classes_.begin(), classes_.end());
  MT_INTERNAL_ASSERT(static_cast<int64_t>(classes_.size()) >= shape_.n_way);
  for (int64_t c : classes_) {
    MT_INTERNAL_ASSERT(
        static_cast<int64_t>(rows_.rows.at(c).size()) >= shape_.per_class());
  }
}

std::vector<int64_t> EpisodeSampler::episode_classes(
    int64_t epoch, int64_t index) const {
  EpisodeRng rng(seed_, stream_, epoch, index);
  return draw_distinct(classes_, shape_.n_way, rng);
}

std::vector<int64_t> EpisodeSampler::rows(
    int64_t epoch, int64_t index, std::vector<int64_t>* classes) const {
  EpisodeRng rng(seed_, stream_, epoch, index);
  const std::vector<int64_t> chosen =
      draw_distinct(classes_, shape_.n_way, rng);
  if (classes)
    *classes = chosen;
  std::vector<int64_t> out(shape_.rows());
  for (int64_t j = 0; j < shape_.n_way; ++j) {
    const std::vector<int64_t> picks =
        draw_distinct(rows_.rows[chosen[j]], shape_.per_class(), rng);
    for (int64_t s = 0; s < shape_.k_shot; ++s)
      out[j * shape_.k_shot + s] = picks[s];
    for (int64_t q = 0; q < shape_.n_query; ++q)
      out[shape_.support() + j * shape_.n_query + q] = picks[shape_.k_shot + q];
  }
  return out;
}

}  // namespace memtrain
