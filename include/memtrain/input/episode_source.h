#pragma once
// Few-shot episodes as a SampleSource (Note [Episodes]): sample i of epoch
// e is episode (e, i) of an EpisodeSampler, read as its shape().rows()
// dataset rows. A batch of n episodes holds x (n * rows, F...) and y
// (n, rows): the episode labels 0..n_way-1 (EpisodeShape::label_at), so
// Batch::size() counts episodes.

#include "memtrain/data/sampling/episodes.h"
#include "memtrain/input/batch_loader.h"

namespace memtrain {

class EpisodeSource : public SampleSource {
 public:
  // `fixed_epoch` >= 0: every epoch reads that epoch's episodes
  // (validation: the same episodes every time).
  EpisodeSource(
      const H5Dataset& data,
      const EpisodeSampler& sampler,
      int64_t fixed_epoch = -1,
      const FiniteCheck* finite = nullptr)
      : data_(data),
        sampler_(sampler),
        fixed_epoch_(fixed_epoch),
        finite_(finite) {}
  void read(int64_t epoch, const std::vector<int64_t>& ids, Batch& into)
      const override;
  Batch allocate(int64_t n, bool pinned) const override;

 private:
  const H5Dataset& data_;
  const EpisodeSampler& sampler_;
  int64_t fixed_epoch_;
  const FiniteCheck* finite_;
};

}  // namespace memtrain
