#pragma once
// bench_memory's models: the synthetic files each reads and the TrainConfig
// each row starts from (bench_memory.cpp runs them per tier, AMP and
// micro-batch).

#include <cstdint>
#include <string>
#include <vector>

#include "memtrain/config/train_config.h"

namespace memtrain::bench {

// The sizes bench_memory's options give (its --help says what each is).
struct ModelSizes {
  int64_t begin = 64, end = 1024, factor = 4;  // mlp, cnn micro-batches
  int64_t windows = 4;                         // warm-up + timed
  int64_t image_size = 224;                    // seresnext50_32x4d, clip
  int64_t volume_size = 64, unet_feature = 16, unet_depth = 3;
  int64_t swin_feature = 48;
  std::string resnet_micros = "8", unet_micros = "2";
  std::string clip_variant = "ViT-B-32", clip_micros = "16";
  int64_t fsct_image_size = 84;
  std::string fsct_micros = "1";
  // dino: Meta's DINOv3 ViT (random weights: the bytes and the time do not
  // depend on them) on volumes of dino_slices slices of dino_size^2, one
  // volume a patch; a row per variant, context scale and slice chunk.
  std::string dino_variants = "vits16", dino_contexts = "0,2";
  std::string dino_chunks = "16", dino_micros = "1";
  int64_t dino_size = 512, dino_slices = 128;
};

// Whether comma-separated `list` names `item`.
bool wanted_in(const std::string& list, const std::string& item);

// "1,2" -> {1, 2}; throws memtrain::Error on an empty list.
std::vector<int64_t> numbers(const std::string& list);

// Writes into `dir` the synthetic files that the models of comma-separated
// `models` read, enough rows for sizes.windows windows of the largest
// micro-batch.
void make_model_data(
    const ModelSizes& sizes, const std::string& models, const std::string& dir);

// The base configs of `model` (an entry of --models: a model.name, fsct or
// dino) on make_model_data's files in `dir`, and the micro-batches their
// rows use: one config, or for dino one per variant, context scale and
// slice chunk.
std::vector<TrainConfig> model_configs(
    const std::string& model,
    const ModelSizes& sizes,
    const std::string& dir,
    std::vector<int64_t>* micros);

}  // namespace memtrain::bench
