#pragma once
// Few-shot episodes (Note [Episodes]): the class split into disjoint
// training and validation classes, and EpisodeSampler, which turns
// (seed, stream, epoch, index) alone into the dataset rows of one N-way
// K-shot episode with Q queries per class.

#include <cstdint>
#include <string>
#include <vector>

namespace memtrain {

struct EpisodeShape {
  int64_t n_way = 5;
  int64_t k_shot = 1;
  int64_t n_query = 15;
  int64_t per_class() const {
    return k_shot + n_query;
  }
  int64_t support() const {
    return n_way * k_shot;
  }
  int64_t queries() const {
    return n_way * n_query;
  }
  int64_t rows() const {
    return n_way * per_class();
  }
  // The episode label (0..n_way-1) of position p of an episode's rows:
  // support class-major, then queries class-major.
  int64_t label_at(int64_t p) const {
    return p < support() ? p / k_shot : (p - support()) / n_query;
  }
};

struct ClassSplit {
  std::vector<int64_t> train;  // ascending class ids
  std::vector<int64_t> val;    // ascending, disjoint from train
};

// Which rows may become episodes: the classes of a labelled file.
struct ClassRows {
  // rows[c]: the rows of class c, ascending.
  std::vector<std::vector<int64_t>> rows;
  std::vector<std::string> names;  // may be empty
  // "class 7 ('dog')" or "class 7".
  std::string describe(int64_t c) const;
  static ClassRows from_labels(
      const std::vector<int64_t>& row_labels,
      int64_t num_classes,
      std::vector<std::string> names);
};

// Splits the classes: `val_ids` when not empty (checked: in range, no
// repeats), else round(fraction x classes) (at least 1) drawn from `seed`.
// Checks that the two sets are disjoint, that the training set (and the
// validation set when `need_val`) has at least n_way classes, and refuses,
// naming it, any class of either set with fewer than k_shot + n_query rows.
// Throws memtrain::Error; `source` names the file in messages.
ClassSplit split_classes(
    const ClassRows& classes,
    const std::vector<int64_t>& val_ids,
    double fraction,
    uint64_t seed,
    const EpisodeShape& shape,
    bool need_val,
    const std::string& source);

// The random stream of one episode (Note [Episodes]): SplitMix64.
class EpisodeRng {
 public:
  EpisodeRng(uint64_t seed, uint64_t stream, int64_t epoch, int64_t index);
  uint64_t next();
  // Uniform in [0, bound), unbiased (rejection).
  uint64_t below(uint64_t bound);

 private:
  uint64_t state_;
};

// The first `m` of a partial Fisher-Yates shuffle of `items` with `rng`.
std::vector<int64_t> draw_distinct(
    std::vector<int64_t> items, int64_t m, EpisodeRng& rng);

class EpisodeSampler {
 public:
  // Episodes over `classes` (ids into `rows`); `stream` separates the
  // training (0) and validation (1) episodes of one seed.
  EpisodeSampler(
      const ClassRows& rows,
      std::vector<int64_t> classes,
      EpisodeShape shape,
      uint64_t seed,
      uint64_t stream);

  const EpisodeShape& shape() const {
    return shape_;
  }
  const std::vector<int64_t>& classes() const {
    return classes_;
  }
  // The episode's classes (dataset ids), in episode-label order.
  std::vector<int64_t> episode_classes(int64_t epoch, int64_t index) const;
  // Its shape().rows() dataset rows: support class-major, then queries
  // class-major (EpisodeShape::label_at).
  // `classes`, when given, receives episode_classes(epoch, index) from the
  // same draw.
  std::vector<int64_t> rows(
      int64_t epoch,
      int64_t index,
      std::vector<int64_t>* classes = nullptr) const;

 private:
  const ClassRows& rows_;
  std::vector<int64_t> classes_;
  EpisodeShape shape_;
  uint64_t seed_;
  uint64_t stream_;
};

}  // namespace memtrain
