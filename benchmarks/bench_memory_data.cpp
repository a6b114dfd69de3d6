#include "bench_memory_data.h"

#include <algorithm>
#include <sstream>

#include "memtrain/data/synthetic/synthetic.h"
#include "memtrain/model/registry.h"
#include "memtrain/util/error.h"

namespace memtrain::bench {
namespace {

int64_t largest(const std::string& list) {
  const std::vector<int64_t> n = numbers(list);
  return *std::max_element(n.begin(), n.end());
}

// fsct: launch/configs/fewshot-v100.yaml's episodes, 5-way 5-shot with 16
// queries a class, drawn from 8 classes of 48 images on average (labels are
// drawn at random; 2 classes are held out as data.val_classes' 0.2 says),
// so every class has the 21 images an episode takes from it.
constexpr int64_t kFsctWay = 5, kFsctShot = 5, kFsctQuery = 16;
constexpr int64_t kFsctClasses = 8, kFsctPerClass = 48;

}  // namespace

bool wanted_in(const std::string& list, const std::string& item) {
  return ("," + list + ",").find("," + item + ",") != std::string::npos;
}

std::vector<int64_t> numbers(const std::string& list) {
  std::vector<int64_t> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');)
    out.push_back(std::stoll(item));
  MT_CHECK(!out.empty(), "an empty list of numbers");
  return out;
}

void make_model_data(
    const ModelSizes& sizes,
    const std::string& models,
    const std::string& dir) {
  const auto wanted = [&models](const std::string& m) {
    return wanted_in(models, m);
  };
  const int64_t samples = std::max<int64_t>(sizes.end * sizes.windows, 256);
  if (wanted("mlp")) {
    SyntheticSpec f;
    f.samples = samples;
    f.features = 64;
    make_synthetic(f, dir + "/features.h5");
  }
  SyntheticSpec im;
  im.kind = "images";
  im.samples = samples;
  im.height = im.width = 32;
  // cnn, and any other model.name without a file of its own below, on
  // small images.
  std::stringstream list(models);
  for (std::string m; std::getline(list, m, ',');) {
    if (!wanted_in(
            "mlp,seresnext50_32x4d,unet3d,swin_unetr,clip,fsct,dino", m)) {
      make_synthetic(im, dir + "/images.h5");
      break;
    }
  }
  if (wanted("seresnext50_32x4d")) {
    SyntheticSpec big = im;
    big.samples = largest(sizes.resnet_micros) * sizes.windows;
    big.classes = 10;
    big.height = big.width = sizes.image_size;
    make_synthetic(big, dir + "/big_images.h5");
  }
  if (wanted("unet3d") || wanted("swin_unetr")) {
    SyntheticSpec v;
    v.kind = "volumes";
    v.samples = largest(sizes.unet_micros) * sizes.windows;
    v.channels = 1;
    v.classes = 2;
    v.depth = v.height = v.width = sizes.volume_size;
    make_synthetic(v, dir + "/volumes.h5");
  }
  if (wanted("clip")) {
    SyntheticSpec c;  // random images and CLIP-shaped tokens, unmatched
    c.kind = "captions";
    c.samples = largest(sizes.clip_micros) * sizes.windows;
    c.height = c.width = sizes.image_size;
    make_synthetic(c, dir + "/captions.h5");
  }
  if (wanted("fsct")) {
    SyntheticSpec e = im;  // uint8, as convert-images writes miniImageNet
    e.classes = kFsctClasses;
    e.samples = kFsctClasses * kFsctPerClass;
    e.dtype = "uint8";
    e.height = e.width = sizes.fsct_image_size;
    make_synthetic(e, dir + "/fewshot_images.h5");
  }
  if (wanted("dino")) {
    SyntheticSpec v;  // one patch a volume: the context crop leaves it
    v.kind = "volumes";
    v.samples = largest(sizes.dino_micros) * sizes.windows;
    v.channels = 1;
    v.classes = 2;
    v.depth = sizes.dino_slices;
    v.height = v.width = sizes.dino_size;
    make_synthetic(v, dir + "/dino_volumes.h5");
  }
}

std::vector<TrainConfig> model_configs(
    const std::string& model,
    const ModelSizes& sizes,
    const std::string& dir,
    std::vector<int64_t>* micros) {
  TrainConfig base;
  const bool fsct = model == "fsct", dino = model == "dino";
  base.model.name = fsct   ? ModelName::kResnet50
                    : dino ? ModelName::kDinov3
                           : choice_of<ModelName>(model);
  const bool mlp = base.model.name == ModelName::kMlp;
  base.model.depth = mlp ? 16 : 4;
  base.model.hidden = mlp ? 64 : 16;
  base.data.train = dir + (mlp ? "/features.h5" : "/images.h5");
  micros->clear();
  for (int64_t micro = sizes.begin; micro <= sizes.end; micro *= sizes.factor)
    micros->push_back(micro);
  if (fsct) {
    // launch/configs/fewshot-v100.yaml's model and episodes; a sample is an
    // episode, and no validation episodes are drawn.
    base.model.head = Head::kCosineTransformer;
    base.model.embed_dim = 512;
    base.data.train = dir + "/fewshot_images.h5";
    base.data.episodes.n_way = kFsctWay;
    base.data.episodes.k_shot = kFsctShot;
    base.data.episodes.n_query = kFsctQuery;
    base.validation.episodes = 0;
    *micros = numbers(sizes.fsct_micros);
  } else if (base.model.name == ModelName::kClip) {
    // One micro-step a window (effective batch = micro-batch), so a row is
    // one micro-batch's peak under exact contrastive accumulation.
    base.model.variant = sizes.clip_variant;
    base.data.train = dir + "/captions.h5";
    base.training.contrastive_accumulation = ContrastiveAccumulation::kExact;
    *micros = numbers(sizes.clip_micros);
  } else if (base.model.name == ModelName::kSeresnext50) {
    base.data.train = dir + "/big_images.h5";
    *micros = numbers(sizes.resnet_micros);
  } else if (dino) {
    // Slices of D; the frozen backbone's random weights (model.pretrained
    // empty) cost what Meta's cost. No validation.
    base.data.train = dir + "/dino_volumes.h5";
    base.data.patch_size = {
        sizes.dino_slices, sizes.dino_size, sizes.dino_size};
    base.data.patches_per_volume = 1;
    *micros = numbers(sizes.dino_micros);
  } else if (trains_on(base.model.name, kOnVolumes)) {
    const bool swin = base.model.name == ModelName::kSwinUnetr;
    base.model.depth = sizes.unet_depth;
    base.model.feature_size = swin ? sizes.swin_feature : sizes.unet_feature;
    base.model.norm = Norm::kInstance;
    base.data.train = dir + "/volumes.h5";
    base.data.patch_size = {
        sizes.volume_size, sizes.volume_size, sizes.volume_size};
    base.data.patches_per_volume = 1;
    *micros = numbers(sizes.unet_micros);
  }
  base.data.val = "";
  base.training.momentum = 0.9;
  base.output.dir = dir;
  base.dist.check_replicas = CheckReplicas::kOff;
  if (!dino)
    return {base};
  std::vector<TrainConfig> out;
  std::stringstream variants(sizes.dino_variants);
  for (std::string variant; std::getline(variants, variant, ',');) {
    std::stringstream contexts(sizes.dino_contexts);
    for (std::string scale; std::getline(contexts, scale, ',');) {
      for (int64_t chunk : numbers(sizes.dino_chunks)) {
        TrainConfig c = base;
        c.model.variant = variant;
        c.model.context.scale = std::stod(scale);
        c.model.slice_chunk = chunk;
        out.push_back(c);
      }
    }
  }
  return out;
}

}  // namespace memtrain::bench
