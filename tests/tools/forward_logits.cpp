// A model's forward on a given input, for comparisons with its peer
// (tests/e2e/swin_unetr_monai.sh): builds model.name for the input's
// channels and --classes outputs with the config keys given, loads
// --weights (safetensors, strict, by name), runs the input's tensor "x"
// (N, C, D, H, W, float32) in eval mode without gradients (fp32, CPU), and
// writes "logits" to --out. --names writes the model's state (parameters
// and buffers, state-dict order) as "name shape" lines.
// usage: forward_logits --weights W --input X --out Y [--names F]
//                       --classes K [section.key=value ...]

#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "memtrain/config/train_config.h"
#include "memtrain/model/models.h"
#include "memtrain/model/registry.h"
#include "memtrain/util/error.h"
#include "memtrain/weights/model_state.h"
#include "memtrain/weights/safetensors.h"

int main(int argc, char** argv) {
  using namespace memtrain;
  std::string weights, input, out, names;
  int64_t classes = 0;
  std::vector<std::string> keys;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc)
        throw std::runtime_error(a + " needs a value");
      return std::string(argv[++i]);
    };
    if (a == "--weights")
      weights = next();
    else if (a == "--input")
      input = next();
    else if (a == "--out")
      out = next();
    else if (a == "--names")
      names = next();
    else if (a == "--classes")
      classes = std::stoll(next());
    else
      keys.push_back(a);
  }
  try {
    const TrainConfig cfg = TrainConfig::load("", keys);
    check_model_config(cfg);
    NamedTensors in = load_safetensors(input);
    MT_CHECK(in.size() == 1 && in[0].first == "x", input, ": one tensor x");
    const at::Tensor x = in[0].second.to(torch::kFloat32);
    ModelInput mi;
    mi.kind = SampleKind::kVolumes;
    mi.sample_shape = {x.size(1), x.size(2), x.size(3), x.size(4)};
    mi.num_classes = classes;
    auto model = make_model(cfg.model, mi);
    if (!names.empty()) {
      std::ofstream f(names);
      for (const auto& [name, t] : state_tensors(*model))
        f << name << " " << t.sizes() << "\n";
    }
    load_weights_file(*model, weights, /*strict=*/true, "--weights");
    model->eval();
    torch::NoGradGuard no_grad;
    save_safetensors(out, {{"logits", model->forward(x).contiguous()}});
  } catch (const std::exception& e) {
    std::cerr << "forward_logits: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
