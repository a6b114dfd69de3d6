// memtrain's DINOv3 backbone on given images, for comparisons with timm's
// (tests/e2e/dinov3_timm.sh): builds --variant, loads --weights (Meta's or
// timm's names, strict: weights/dinov3_weights.h), prints the load's
// report, runs every tensor x_* of --input ((B, 3, H, W), float32) in
// eval mode without gradients (fp32, CPU) and writes, per input K and
// feature layer i of the variant, K/layer_i (B, D, h, w) and K/cls_i
// (B, D) to --out. A refused file: its one message, exit 2.
// usage: dinov3_features --variant V --weights W --input X --out Y

#include <torch/torch.h>

#include <iostream>
#include <string>

#include "memtrain/model/blocks/dinov3_vit.h"
#include "memtrain/util/error.h"
#include "memtrain/weights/dinov3_weights.h"
#include "memtrain/weights/safetensors.h"

int main(int argc, char** argv) {
  using namespace memtrain;
  std::string variant, weights, input, out;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--variant")
      variant = v;
    else if (a == "--weights")
      weights = v;
    else if (a == "--input")
      input = v;
    else if (a == "--out")
      out = v;
  }
  try {
    Dinov3Vit model(dinov3_spec(variant));
    const Dinov3Load r =
        load_dinov3_weights(model, weights, /*strict=*/true, "--weights");
    for (const auto& l : r.lines("--weights"))
      std::cout << l << "\n";
    model.eval();
    torch::NoGradGuard no_grad;
    NamedTensors got;
    for (const auto& [name, x] : load_safetensors(input)) {
      const Dinov3Features f =
          model.forward_features(x.to(torch::kFloat32), model.spec().layers);
      for (size_t j = 0; j < f.layers.size(); ++j) {
        const std::string i = std::to_string(f.layers[j]);
        got.emplace_back(name + "/layer_" + i, f.maps[j].contiguous());
        got.emplace_back(name + "/cls_" + i, f.cls[j].contiguous());
      }
    }
    save_safetensors(out, got);
  } catch (const std::exception& e) {
    std::cerr << "dinov3_features: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
