#include "memtrain/weights/dinov3_weights.h"

#include <algorithm>
#include <map>
#include <regex>

#include "memtrain/util/error.h"
#include "weights/names.h"

namespace memtrain {
namespace {

std::string shape_of(const at::Tensor& t) {
  return shape_text(t.sizes().vec());
}

bool has(const std::map<std::string, at::Tensor>& m, const std::string& k) {
  return m.count(k) > 0;
}

// timm's names that are Meta's under another name (the rest are the same).
std::string meta_name(const std::string& timm) {
  static const std::vector<std::pair<std::regex, std::string>> table{
      {std::regex("^reg_token$"), "storage_tokens"},
      {std::regex("^(blocks\\.\\d+\\.)gamma_1$"), "$1ls1.gamma"},
      {std::regex("^(blocks\\.\\d+\\.)gamma_2$"), "$1ls2.gamma"},
  };
  for (const auto& [from, to] : table)
    if (std::regex_match(timm, from))
      return std::regex_replace(timm, from, to);
  return timm;
}

// The size a file's class token width and block count are, "" for none.
std::string size_named(int64_t dim, int64_t depth) {
  for (const auto& v : dinov3_variants()) {
    const Dinov3Spec s = dinov3_spec(v);
    if (s.dim == dim && s.depth == depth)
      return v;
  }
  return "";
}

}  // namespace

NamedTensors dinov3_state(
    NamedTensors file,
    const Dinov3Vit& backbone,
    const std::string& what,
    const std::string& path,
    std::string* naming,
    std::vector<std::string>* changes) {
  const Dinov3Spec& spec = backbone.spec();
  const std::string where = what + ": " + path + ": ";
  std::map<std::string, at::Tensor> by_name;
  for (const auto& [name, t] : file)
    by_name.emplace(name, t);
  const bool meta = has(by_name, "storage_tokens");
  const bool timm = has(by_name, "reg_token");
  if (meta == timm) {
    std::vector<std::string> names;
    for (const auto& [name, t] : file)
      names.push_back(name);
    throw Error(
        where +
        (meta ? "holds both storage_tokens (Meta's name) and reg_token "
                "(timm's): not one DINOv3 ViT state dict"
              : "not a DINOv3 ViT state dict (no storage_tokens, as Meta "
                "names its 4 register tokens, nor reg_token, as timm does); "
                "its names: " +
                    first_few(names)));
  }
  for (const auto& [name, t] : file) {
    static const std::regex swiglu("\\.mlp\\.(w1|w2|w3|w12|fc1_g|fc1_x)\\.");
    if (std::regex_search(name, swiglu))
      throw Error(
          where + "a SwiGLU DINOv3 ('" + name +
          "': ViT-S+, H+ or 7B): not supported yet; memtrain's dinov3 has "
          "vits16 and vitb16 (GELU MLPs)");
  }

  // The file's size: its class token's width and its blocks.
  const at::Tensor& cls =
      by_name.count("cls_token") ? by_name.at("cls_token") : at::Tensor();
  int64_t depth = 0;
  static const std::regex block("^blocks\\.(\\d+)\\.");
  for (const auto& [name, t] : file) {
    std::smatch m;
    if (std::regex_search(name, m, block))
      depth = std::max<int64_t>(depth, std::stoll(m[1].str()) + 1);
  }
  const std::string looks =
      cls.defined() ? size_named(cls.size(-1), depth) : std::string();

  NamedTensors out;
  if (meta) {
    *naming = "Meta's DINOv3 names";
    for (auto& [name, t] : file) {
      if (name == "mask_token") {
        MT_CHECK(
            torch::isfinite(t).all().item<bool>(),
            where,
            "mask_token is not finite: Meta's model adds 0 * mask_token to "
            "the class token, which makes every feature NaN; this file is "
            "not a usable DINOv3");
        changes->push_back("mask_token dropped (Meta adds 0 * mask_token)");
        continue;
      }
      if (name == "rope_embed.periods" && t.scalar_type() != torch::kFloat32)
        changes->push_back(detail::concat(
            "rope_embed.periods loaded as stored: ",
            t.scalar_type(),
            " values in the float32 buffer"));
      out.emplace_back(name, t);
    }
  } else {
    const bool q = std::any_of(file.begin(), file.end(), [](const auto& p) {
      return p.first.find(".attn.q_bias") != std::string::npos;
    });
    *naming = q ? "timm's DINOv3 names (q and v biases: *_dinov3_qkvb)"
                : "timm's DINOv3 names (no qkv bias: *_dinov3)";
    for (auto& [name, t] : file) {
      if (ends_with(name, ".q_bias") || ends_with(name, ".v_bias"))
        continue;  // merged into the block's qkv bias below
      out.emplace_back(meta_name(name), t);
    }
    // Meta's layout of a block: its qkv bias and mask next to its weight.
    NamedTensors ordered;
    int64_t blocks = 0;
    for (auto& [name, t] : out) {
      ordered.emplace_back(name, t);
      static const std::regex qkv_w("^(blocks\\.\\d+\\.attn\\.qkv\\.)weight$");
      std::smatch m;
      if (!std::regex_match(name, m, qkv_w))
        continue;
      const std::string p = m[1].str();
      const std::string attn = p.substr(0, p.size() - 4);  // "blocks.N.attn."
      const bool qb = has(by_name, attn + "q_bias");
      const bool vb = has(by_name, attn + "v_bias");
      MT_CHECK(
          qb == vb,
          where,
          attn,
          qb ? "q_bias without v_bias" : "v_bias without q_bias",
          ": timm's qkv bias is a q and a v part, both or neither");
      const int64_t width = t.size(0) / 3;
      if (qb) {
        const at::Tensor qt = by_name.at(attn + "q_bias");
        const at::Tensor vt = by_name.at(attn + "v_bias");
        MT_CHECK(
            qt.numel() == width && vt.numel() == width,
            where,
            attn,
            "q_bias and v_bias are ",
            shape_of(qt),
            " and ",
            shape_of(vt),
            ", not [",
            width,
            "] as the qkv weight ",
            shape_of(t),
            " makes them");
        ordered.emplace_back(
            p + "bias",
            torch::cat(
                {qt.to(torch::kFloat32),
                 torch::zeros({width}),
                 vt.to(torch::kFloat32)}));
      } else {
        ordered.emplace_back(p + "bias", torch::zeros({3 * width}));
      }
      ++blocks;
      ordered.emplace_back(
          p + "bias_mask",
          torch::cat(
              {torch::ones({width}),
               torch::zeros({width}),
               torch::ones({width})}));
    }
    out = std::move(ordered);
    changes->push_back(detail::concat(
        "blocks.*.attn.qkv.bias made in ",
        blocks,
        " blocks: ",
        q ? "[q_bias, 0, v_bias]" : "0 (timm's model has no qkv bias)",
        "; bias_mask made: [1, 0, 1], as Meta's init_weights sets it"));
    // timm recomputes the periods in float32; so does memtrain's formula.
    out.emplace_back(
        "rope_embed.periods",
        Dinov3Rope(spec.dim / spec.heads, spec.rope_base).periods().clone());
    changes->push_back(
        "rope_embed.periods made: computed in float32, as timm does");
  }

  // A file of another size: the first tensor whose shape differs.
  std::map<std::string, at::Tensor> converted;
  for (const auto& [name, t] : out)
    converted.emplace(name, t);
  const NamedTensors mine = state_tensors(backbone);
  for (const auto& [name, t] : mine) {
    const auto it = converted.find(name);
    if (it == converted.end() || it->second.sizes() == t.sizes())
      continue;
    throw Error(
        where + name + " " + shape_of(it->second) + " in the file, " +
        shape_of(t) + " in " + spec.variant +
        (looks.empty()
             ? " (the file's class token is " +
                   (cls.defined() ? shape_of(cls) : std::string("absent")) +
                   " with " + std::to_string(depth) + " blocks)"
             : " - this looks like " + looks) +
        "; set model.variant to the file's size");
  }
  // A non-finite tensor whose cause can be named: a bias mask, a qkv bias
  // made from timm's q_bias and v_bias. load_state refuses any other the
  // backbone takes, naming it.
  for (const auto& [name, ignored] : mine) {
    const bool made = timm && ends_with(name, ".qkv.bias");
    if (!ends_with(name, ".bias_mask") && !made)
      continue;
    const auto it = converted.find(name);
    if (it == converted.end() || !it->second.is_floating_point() ||
        torch::isfinite(it->second).all().item<bool>())
      continue;
    if (ends_with(name, ".bias_mask"))
      throw Error(
          where + name +
          " holds NaN: Meta's model creates its bias masks full of NaN and "
          "init_weights() sets them; this file was saved before that. Take "
          "the released weights, or call model.init_weights() before "
          "torch.save");
    throw Error(
        where + name + " is not finite (NaN or inf) (from q_bias, v_bias)");
  }
  return out;
}

std::vector<std::string> Dinov3Load::lines(const std::string& what) const {
  std::vector<std::string> out{what + ": " + report.path + ": " + naming};
  for (const auto& l : report.lines(what))
    out.push_back(l);
  for (const auto& c : changes)
    out.push_back(what + ": " + c);
  return out;
}

namespace {

Dinov3Load load_dinov3_file(
    Dinov3Vit& backbone,
    TorchWeights file,
    int64_t renamed,
    const std::string& path,
    bool strict,
    const std::string& what) {
  Dinov3Load r;
  const NamedTensors tensors = dinov3_state(
      std::move(file.tensors), backbone, what, path, &r.naming, &r.changes);
  r.report = load_state(backbone, tensors, path, strict, what, "");
  r.report.entry = file.entry;
  r.report.renamed = renamed;
  return r;
}

}  // namespace

Dinov3Load load_dinov3_weights(
    Dinov3Vit& backbone,
    const std::string& path,
    bool strict,
    const std::string& what,
    const std::vector<std::string>& rename) {
  int64_t renamed = 0;
  TorchWeights file = read_weights_file(path, what, rename, &renamed);
  return load_dinov3_file(
      backbone, std::move(file), renamed, path, strict, what);
}

LoadReport load_pretrained_weights(
    torch::nn::Module& model,
    const std::string& path,
    bool strict,
    const std::string& what,
    const std::vector<std::string>& rename,
    std::vector<std::string>* lines) {
  const auto* child = model.named_children().find("backbone");
  auto* vit = child ? dynamic_cast<Dinov3Vit*>(child->get()) : nullptr;
  LoadReport r;
  if (vit == nullptr) {
    r = load_weights_file(model, path, strict, what, rename);
    *lines = r.lines(what);
    return r;
  }
  int64_t renamed = 0;
  TorchWeights file = read_weights_file(path, what, rename, &renamed);
  auto any_starts = [&](const std::string& prefix) {
    return std::any_of(
        file.tensors.begin(), file.tensors.end(), [&](const auto& t) {
          return t.first.rfind(prefix, 0) == 0;
        });
  };
  if (any_starts("backbone.") && any_starts("head.")) {  // a whole model
    r = load_state(model, file.tensors, path, strict, what, "head");
    r.entry = file.entry;
    r.renamed = renamed;
    *lines = r.lines(what);
    return r;
  }
  // A backbone, its names maybe under "backbone." (a framework's).
  for (auto& [name, t] : file.tensors)
    if (name.rfind("backbone.", 0) == 0)
      name = name.substr(9);
  const Dinov3Load d =
      load_dinov3_file(*vit, std::move(file), renamed, path, strict, what);
  *lines = d.lines(what);
  return d.report;
}

}  // namespace memtrain
