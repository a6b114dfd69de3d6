// The ResNets (timm's names, shapes and parameter counts against the lists
// of tests/data written from the architecture by tests/peers/resnet_keys.py;
// forward shapes; checkpointed stages giving the same gradients and running
// statistics) and the weights by name (weights/model_state.h): the
// pretrained report and strict refusal, freezing, the config keys.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "memtrain/config/train_config.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/model/models.h"
#include "memtrain/model/registry.h"
#include "memtrain/util/error.h"
#include "memtrain/weights/model_state.h"

namespace memtrain {
namespace {

std::shared_ptr<Classifier> resnet(
    const std::string& name, int64_t classes, int64_t seed = 3) {
  ModelConfig cfg;
  cfg.name = choice_of<ModelName>(name);
  cfg.seed = seed;
  return make_model(cfg, {SampleKind::kImages, {3, 64, 64}, classes, 0});
}

std::string shape_text(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i)
    s += (i ? "," : "") + std::to_string(t.size(i));
  return s + "]";
}

int64_t parameter_count(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters())
    n += p.numel();
  return n;
}

void expect_timm_keys(const std::string& name, int64_t expected_params) {
  auto net = resnet(name, 1000);
  // MEMTRAIN_TEST_DATA in the environment points a relocated binary (the GPU
  // bundle) at its copy of tests/data; otherwise the source tree's.
  const char* env = std::getenv("MEMTRAIN_TEST_DATA");
  const std::string data =
      env != nullptr && *env != '\0' ? env : MEMTRAIN_TEST_DATA;
  std::ifstream in(data + "/" + name + "_keys.txt");
  ASSERT_TRUE(in.good()) << name;
  std::vector<std::string> want, got;
  for (std::string line; std::getline(in, line);)
    want.push_back(line);
  for (const auto& [n, t] : state_tensors(*net)) {
    got.push_back(
        n + " " + shape_text(t) + " " +
        (t.scalar_type() == torch::kLong ? "I64" : "F32"));
  }
  ASSERT_EQ(got.size(), want.size()) << name;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(got[i], want[i]) << name << " tensor " << i;
  const int64_t params = parameter_count(*net);
  std::printf(
      "%s: %zu tensors, %lld parameters\n",
      name.c_str(),
      got.size(),
      static_cast<long long>(params));
  EXPECT_EQ(params, expected_params) << name;
}

TEST(ResNet, SeResNeXtKeysShapesAndCountAreTimms) {
  expect_timm_keys("seresnext50_32x4d", 27559896);
}

TEST(ResNet, ResNet50KeysShapesAndCountAreTimms) {
  expect_timm_keys("resnet50", 25557032);
}

TEST(ResNet, ForwardShapeSegmentsAndInit) {
  auto net = resnet("seresnext50_32x4d", 10);
  // One segment per bottleneck, [3, 4, 6, 3] of them, layer1.0 first.
  const std::vector<std::string>& names = net->segment_names();
  ASSERT_EQ(names.size(), 16u);
  EXPECT_EQ(names.front(), "layer1.0");
  EXPECT_EQ(names[3], "layer2.0");
  EXPECT_EQ(names[7], "layer3.0");
  EXPECT_EQ(names.back(), "layer4.2");
  const torch::Tensor y = net->forward(torch::randn({2, 3, 64, 64}));
  EXPECT_EQ(y.sizes(), torch::IntArrayRef({2, 10}));
  const auto p = net->named_parameters();
  // timm's zero_init_last and batch-norm init.
  EXPECT_EQ(p["layer2.1.bn3.weight"].abs().sum().item<double>(), 0.0);
  EXPECT_TRUE(torch::equal(p["bn1.weight"], torch::ones({64})));
  // Same seed, same weights; another seed, others.
  auto again = resnet("seresnext50_32x4d", 10);
  auto other = resnet("seresnext50_32x4d", 10, 4);
  EXPECT_TRUE(torch::equal(
      p["layer3.0.conv2.weight"],
      again->named_parameters()["layer3.0.conv2.weight"]));
  EXPECT_FALSE(torch::equal(
      p["layer3.0.conv2.weight"],
      other->named_parameters()["layer3.0.conv2.weight"]));
}

// Checkpointed bottlenecks (batch-norm in training mode, the same batch): the
// same gradients and the same running statistics, updated once.
TEST(ResNet, CheckpointedBlocksGiveTheSameGradientsAndStatistics) {
  auto plain = resnet("seresnext50_32x4d", 5);
  auto ckpt = resnet("seresnext50_32x4d", 5);
  {
    torch::NoGradGuard no_grad;  // no zero gammas: every weight gets a gradient
    torch::manual_seed(11);
    for (const auto& [name, t] : state_tensors(*plain)) {
      if (name.find(".weight") != std::string::npos && t.dim() == 1)
        t.copy_(1.0 + 0.3 * torch::randn_like(t));
    }
    for (const auto& [name, t] : state_tensors(*ckpt))
      t.copy_(
          plain->named_parameters().contains(name)
              ? plain->named_parameters()[name]
              : plain->named_buffers()[name]);
  }
  ckpt->set_checkpointed(ckpt->num_segments());
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({4, 3, 32, 32});
  const torch::Tensor y = torch::tensor({0, 1, 2, 4});
  for (auto* m : {&plain, &ckpt}) {
    (*m)->train();
    torch::nn::functional::cross_entropy((*m)->forward(x), y).backward();
  }
  double worst = 0, scale = 0;
  const auto a = plain->named_parameters();
  const auto b = ckpt->named_parameters();
  for (const auto& item : a) {
    const torch::Tensor& ga = item.value().grad();
    const torch::Tensor& gb = b[item.key()].grad();
    ASSERT_TRUE(ga.defined() && gb.defined()) << item.key();
    worst = std::max(worst, (ga - gb).abs().max().item<double>());
    scale = std::max(scale, ga.abs().max().item<double>());
  }
  std::printf(
      "checkpointed vs plain: max |grad diff| %.3g (max |grad| %.3g)\n",
      worst,
      scale);
  EXPECT_GT(scale, 1e-3);
  EXPECT_LE(worst, 1e-5 * scale);
  const auto sa = plain->named_buffers();
  const auto sb = ckpt->named_buffers();
  for (const auto& item : sa) {
    EXPECT_TRUE(torch::allclose(item.value(), sb[item.key()], 1e-6, 1e-7))
        << item.key();
  }
  EXPECT_EQ(sb["layer4.2.bn2.num_batches_tracked"].item<int64_t>(), 1);
  EXPECT_EQ(sb["layer1.0.bn1.num_batches_tracked"].item<int64_t>(), 1);
}

// A segment per bottleneck pays: the peak of one forward and backward
// above the parameters and their gradients (activations and what backward
// allocates, in the accounted device domain) with every bottleneck
// checkpointed is at most 0.6x that without, and each further checkpointed
// segment lowers it or leaves it. (bench_memory measures whole windows.)
TEST(ResNet, CheckpointingEveryBottleneckCutsThePeak) {
  auto net = resnet("seresnext50_32x4d", 10);
  torch::manual_seed(3);
  const torch::Tensor y = torch::randint(0, 10, {8});
  {  // the gradients exist before the first measurement
    memory::DeviceScope device;
    torch::nn::functional::cross_entropy(
        net->forward(torch::randn({2, 3, 32, 32})), y.slice(0, 0, 2))
        .backward();
  }
  std::vector<double> peaks;
  for (int64_t k : {int64_t{0}, int64_t{3}, int64_t{7}, net->num_segments()}) {
    net->set_checkpointed(k);
    net->zero_grad(/*set_to_none=*/false);  // kept, zeroed (2.x: none)
    memory::DeviceScope device;
    const torch::Tensor x = torch::randn({8, 3, 96, 96});
    memory::reset_peak();
    const int64_t before = memory::stats().allocated;
    torch::nn::functional::cross_entropy(net->forward(x), y).backward();
    peaks.push_back(
        static_cast<double>(memory::stats().peak_allocated - before));
    std::printf(
        "%ld of 16 bottlenecks checkpointed: peak %.1f MB\n",
        static_cast<long>(k),
        peaks.back() / 1e6);
  }
  for (size_t i = 1; i < peaks.size(); ++i)
    EXPECT_LE(peaks[i], peaks[i - 1]) << i;
  EXPECT_LE(peaks.back(), 0.6 * peaks.front());
}

// One value per channel at layer4 (1 image of 32x32): a message naming
// the sizes and the fix, not LibTorch's; 2 images, or eval mode, run.
TEST(ResNet, OneValuePerChannelIsNamed) {
  auto net = resnet("resnet50", 3);
  net->train();
  try {
    net->forward(torch::randn({1, 3, 32, 32}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("1 image(s) of 32x32 reaches layer4 at 1x1"),
        std::string::npos)
        << e.what();
  }
  EXPECT_EQ(net->forward(torch::randn({2, 3, 32, 32})).size(0), 2);
  EXPECT_EQ(net->forward(torch::randn({1, 3, 33, 33})).size(0), 1);
  net->eval();
  EXPECT_EQ(net->forward(torch::randn({1, 3, 32, 32})).size(0), 1);
}

TEST(ModelState, ModelsWithoutBuffersSaveTheirParametersAsBefore) {
  ModelConfig cfg;
  cfg.name = ModelName::kCnn;
  auto net = make_model(cfg, {SampleKind::kImages, {3, 8, 8}, 4, 0});
  const NamedTensors s = state_tensors(*net);
  const auto p = net->named_parameters();
  ASSERT_EQ(s.size(), p.size());
  for (size_t i = 0; i < s.size(); ++i)
    EXPECT_EQ(s[i].first, p[i].key());
}

// A file of another head (4 classes for a 3-class model), one buffer
// dropped, one tensor extra, one counter dropped.
NamedTensors other_head_file() {
  auto source = resnet("resnet50", 4, 9);
  NamedTensors file;
  for (const auto& [name, t] : state_tensors(*source)) {
    if (name != "layer4.2.bn3.running_var" &&
        name != "layer4.2.bn3.num_batches_tracked")
      file.emplace_back(name, t.clone());
  }
  file.emplace_back("extra.weight", torch::ones({2}));
  return file;
}

TEST(ModelState, PretrainedReportLoadsWhatMatches) {
  const NamedTensors file = other_head_file();
  auto net = resnet("resnet50", 3);
  const at::Tensor fc_before = net->named_parameters()["fc.weight"].clone();
  const LoadReport r =
      load_state(*net, file, "x.safetensors", false, "model.pretrained", "fc");
  EXPECT_EQ(r.model_tensors, 320);
  EXPECT_EQ(r.loaded.size(), 320u - 4u);
  EXPECT_EQ(r.missing, std::vector<std::string>{"layer4.2.bn3.running_var"});
  EXPECT_EQ(r.unexpected, std::vector<std::string>{"extra.weight"});
  EXPECT_EQ(
      r.counters_absent,
      std::vector<std::string>{"layer4.2.bn3.num_batches_tracked"});
  ASSERT_EQ(r.mismatched.size(), 2u);
  EXPECT_EQ(r.mismatched[0].name, "fc.weight");
  EXPECT_EQ(r.mismatched[0].file, (std::vector<int64_t>{4, 2048}));
  EXPECT_EQ(r.mismatched[0].model, (std::vector<int64_t>{3, 2048}));
  const auto lines = r.lines("model.pretrained");
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(
      lines[0],
      "model.pretrained: x.safetensors: 316 of 320 tensors "
      "loaded");
  EXPECT_EQ(
      lines[3],
      "model.pretrained: 2 shape-mismatched (file vs model): "
      "fc.weight [4, 2048] vs [3, 2048], fc.bias [4] vs [3]");
  // The matching tensors are the file's, the head is the model's own.
  const auto p = net->named_parameters();
  EXPECT_TRUE(torch::equal(p["fc.weight"], fc_before));
  int64_t checked = 0;
  for (const auto& [name, t] : file) {
    if (name == "conv1.weight" || name == "layer3.1.conv2.weight") {
      EXPECT_TRUE(torch::equal(p[name], t)) << name;
      ++checked;
    }
    if (name == "layer2.0.bn1.running_mean") {
      EXPECT_TRUE(torch::equal(net->named_buffers()[name], t)) << name;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3);
}

TEST(ModelState, StrictRefusesNamingTheKeysAndCopiesNothing) {
  const NamedTensors file = other_head_file();
  auto net = resnet("resnet50", 3);
  const at::Tensor conv_before =
      net->named_parameters()["conv1.weight"].clone();
  try {
    load_state(*net, file, "x.safetensors", true, "model.pretrained", "fc");
    FAIL() << "strict load of a mismatching file accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const char* key :
         {"x.safetensors",
          "model.pretrained_strict=true",
          "fc.weight",
          "fc.bias",
          "layer4.2.bn3.running_var",
          "extra.weight",
          "1 missing",
          "1 unexpected",
          "2 shape-mismatched"})
      EXPECT_NE(m.find(key), std::string::npos) << key << " in " << m;
    EXPECT_EQ(m.find("only the head"), std::string::npos) << m;
  }
  EXPECT_TRUE(
      torch::equal(net->named_parameters()["conv1.weight"], conv_before));
  // Only the head differs: the message says what to do.
  NamedTensors head_only;
  for (const auto& [name, t] : state_tensors(*resnet("resnet50", 4, 9)))
    head_only.emplace_back(name, t);
  try {
    load_state(
        *net, head_only, "h.safetensors", true, "model.pretrained", "fc");
    FAIL() << "strict load of another head accepted";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("only the head (fc) differs: set "
                                   "model.pretrained_strict=false"),
        std::string::npos)
        << e.what();
  }
  // A complete file loads strictly, buffers included.
  auto same = resnet("resnet50", 3, 21);
  const LoadReport r = load_state(
      *net,
      state_tensors(*same),
      "s.safetensors",
      true,
      "model.pretrained",
      "fc");
  EXPECT_TRUE(r.complete());
  EXPECT_EQ(r.loaded.size(), 320u);
  EXPECT_TRUE(torch::equal(
      net->named_parameters()["fc.weight"],
      same->named_parameters()["fc.weight"]));
}

TEST(ModelState, FreezeByPrefix) {
  auto net = resnet("resnet50", 3);
  const auto frozen = freeze_parameters(*net, {"conv1", "bn1", "layer1."});
  // conv1 (1) + bn1 (2) + layer1: 3 blocks x (3 convs + 3 bns x 2) + the
  // downsample's conv and bn (3).
  EXPECT_EQ(frozen.size(), 1u + 2u + 3u * 9u + 3u);
  const auto p = net->named_parameters();
  EXPECT_FALSE(p["conv1.weight"].requires_grad());
  EXPECT_FALSE(p["layer1.2.bn3.bias"].requires_grad());
  EXPECT_TRUE(p["layer2.0.conv1.weight"].requires_grad());
  EXPECT_TRUE(p["fc.weight"].requires_grad());
  // A frozen batch-norm uses and keeps its running statistics; the others
  // move theirs; frozen parameters get no gradient.
  const auto bufs = net->named_buffers();
  const at::Tensor stem_mean = bufs["bn1.running_mean"].clone();
  const at::Tensor l2_mean = bufs["layer2.0.bn1.running_mean"].clone();
  net->train();
  torch::nn::functional::cross_entropy(
      net->forward(torch::randn({2, 3, 64, 64})), torch::tensor({0, 2}))
      .backward();
  EXPECT_TRUE(torch::equal(bufs["bn1.running_mean"], stem_mean));
  EXPECT_EQ(bufs["layer1.0.bn1.num_batches_tracked"].item<int64_t>(), 0);
  EXPECT_FALSE(torch::equal(bufs["layer2.0.bn1.running_mean"], l2_mean));
  EXPECT_FALSE(p["conv1.weight"].grad().defined());
  EXPECT_TRUE(p["layer2.0.conv1.weight"].grad().defined());
  // "layer1" matches layer1.* only; a prefix matching nothing is named.
  try {
    freeze_parameters(*net, {"layer1", "layer9", "fc.w"});
    FAIL() << "unknown prefixes accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'layer9', 'fc.w' match no parameter"), std::string::npos)
        << m;
  }
}

TEST(ModelState, ConfigKeys) {
  const TrainConfig a = TrainConfig::load(
      "",
      {"model.name=seresnext50_32x4d",
       "model.freeze=[conv1, bn1,layer1]",
       "model.pretrained=w.safetensors",
       "model.pretrained_strict=false"});
  EXPECT_EQ(
      a.model.freeze, (std::vector<std::string>{"conv1", "bn1", "layer1"}));
  EXPECT_EQ(a.model.pretrained, "w.safetensors");
  EXPECT_FALSE(a.model.pretrained_strict);
  EXPECT_NE(a.to_yaml().find("freeze: [conv1, bn1, layer1]"), std::string::npos)
      << a.to_yaml();
  const TrainConfig b = TrainConfig::load("", {"model.freeze=layer4"});
  EXPECT_EQ(b.model.freeze, std::vector<std::string>{"layer4"});
  const TrainConfig d = TrainConfig::load("", {});
  EXPECT_TRUE(d.model.freeze.empty());
  EXPECT_TRUE(d.model.pretrained_strict);
  EXPECT_THROW(TrainConfig::load("", {"model.freeze=[[a]]"}), Error);
}

}  // namespace
}  // namespace memtrain
