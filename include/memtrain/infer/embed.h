#pragma once
// memtrain embed: the embeddings of every row of a pair file under a pair
// model's weights (model.name clip or dual_encoder), and the image-text
// logits, as open_clip's CLIP.forward gives them: zero-shot and retrieval
// evaluation outside training, and the check of memtrain's CLIP against
// open_clip (tests/e2e/clip_open_clip.sh).

#include <cstdint>
#include <string>

#include "memtrain/config/train_config.h"

namespace memtrain {

class Placement;

struct EmbedSpec {
  std::string data;     // a pair file (docs/data-format.md, Pairs)
  std::string weights;  // loaded strictly, as eval's --weights
  std::string out;      // the HDF5 file written
  int64_t batch = 64;   // rows a forward
  // /logits ([N, N]) only up to this many rows (N^2 floats).
  int64_t max_logits_rows = 4096;
};

struct EmbedResult {
  int64_t rows = 0;
  int64_t embed_dim = 0;
  double logit_scale = 0;  // exp(t)
  bool logits = false;     // /logits written
};

// Builds cfg.model for spec.data, loads spec.weights, runs every row
// through it on `placement`'s device in float32 (no autocast; evaluation
// mode), images transformed as validation transforms them (data.normalize:
// CLIP's statistics for clip), and writes spec.out atomically (a temporary
// file beside, renamed when complete):
//   /embeddings_a [N, d], /embeddings_b [N, d]  float32, unit L2 norm
//     (clip: the image's and the text's, CLIP.forward's features)
//   /logits [N, N] float32 = logit_scale x a b^T (open_clip's
//     logits_per_image), when N <= spec.max_logits_rows
//   /pair_ids [N] int64 (the file's, else the row index)
//   root attributes logit_scale = exp(t) and model, weights, data.
// Throws memtrain::Error naming what is wrong (not a pair file, weights
// that do not fit the model, an output that cannot be written).
EmbedResult embed_pairs(
    const TrainConfig& cfg, const Placement& placement, const EmbedSpec& spec);

}  // namespace memtrain
