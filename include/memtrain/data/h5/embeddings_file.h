#pragma once
// The file `memtrain embed` writes (infer/embed.h): a pair file's
// embeddings and logits. No LibTorch.

#include <cstdint>
#include <string>

namespace memtrain {

struct EmbeddingsFile {
  int64_t rows = 0, dim = 0;
  const float* a = nullptr;       // [rows, dim]
  const float* b = nullptr;       // [rows, dim]
  const float* logits = nullptr;  // [rows, rows], or null: not written
  const int64_t* pair_ids = nullptr;
  double logit_scale = 0;
  std::string model, weights, data;  // root attributes
};

// Writes /embeddings_a, /embeddings_b, /logits (when given), /pair_ids and
// the root attributes to `path` atomically (a temporary file beside it,
// renamed when complete; removed on any error). Throws memtrain::Error
// naming the file.
void write_embeddings_file(const std::string& path, const EmbeddingsFile& e);

}  // namespace memtrain
