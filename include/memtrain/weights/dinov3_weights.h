#pragma once
// DINOv3 ViT weights as users have them, into memtrain's backbone
// (model/blocks/dinov3_vit.h, whose names are Meta's): one table of names
// for the three namings there are.
//
//   Meta (.pth)                timm (_qkvb)             timm (no _qkvb)
//   storage_tokens             reg_token                reg_token
//   mask_token                 -                        -
//   rope_embed.periods         - (recomputed)           -
//   blocks.N.attn.qkv.bias     attn.q_bias, attn.v_bias -
//   blocks.N.attn.qkv.bias_mask -                       -
//   blocks.N.ls1.gamma         blocks.N.gamma_1         blocks.N.gamma_1
//   blocks.N.ls2.gamma         blocks.N.gamma_2         blocks.N.gamma_2
//   (the rest: the same names in all three)
//
// On loading: mask_token is dropped (Meta adds only 0 * mask_token to the
// class token); Meta's periods load as stored (bfloat16, as timm says
// Meta's released files hold them: converted exactly to the float32
// buffer), timm's files get them
// computed in float32 as timm does; timm's q and v biases become the qkv
// bias with a zero key part, and no biases (timm without _qkvb) a zero
// bias; timm's files get the mask [1, 0, 1], the one Meta's init_weights
// sets. memtrain's own export of a backbone is Meta's naming less
// mask_token, and loads as Meta's.

#include <string>
#include <vector>

#include "memtrain/model/blocks/dinov3_vit.h"
#include "memtrain/weights/model_state.h"

namespace memtrain {

// What loading a DINOv3 file found.
struct Dinov3Load {
  std::string naming;                // "Meta's", "timm's with q/v biases", ...
  std::vector<std::string> changes;  // dropped and made tensors, one each
  LoadReport report;
  std::vector<std::string> lines(const std::string& what) const;
};

// The tensors of a DINOv3 state dict in memtrain's names, for `backbone`.
// Throws memtrain::Error, naming `what` and `path`, for, in this order: a
// file of neither naming (its first names), a SwiGLU checkpoint
// (ViT-S+/H+/7B: not supported yet), a non-finite mask_token, half of a
// q/v bias pair, a file of another size (the first tensor whose shape
// differs, with the size the file looks like), a non-finite tensor the
// backbone takes (a NaN bias_mask: Meta's module before init_weights).
// These hold whatever model.pretrained_strict says.
NamedTensors dinov3_state(
    NamedTensors file,
    const Dinov3Vit& backbone,
    const std::string& what,
    const std::string& path,
    std::string* naming,
    std::vector<std::string>* changes);

// Reads `path` (torch.save or safetensors), renames its tensors by
// `rename` (model.pretrained_rename's rules), converts them by
// dinov3_state and load_state()s them into `backbone` (strict: every
// missing and unexpected name is refused, named).
Dinov3Load load_dinov3_weights(
    Dinov3Vit& backbone,
    const std::string& path,
    bool strict,
    const std::string& what,
    const std::vector<std::string>& rename = {});

// model.pretrained (`what`) into `model`. A model with a DINOv3 backbone
// (a child "backbone" that is a Dinov3Vit: model.name=dinov3) takes a file
// of the whole model (memtrain's own model.safetensors: "backbone." and
// "head." names) by name, and a file of a backbone (Meta's or timm's
// names, also under "backbone.") into its backbone through the table
// above; any other model: load_weights_file. *lines: the load's report.
LoadReport load_pretrained_weights(
    torch::nn::Module& model,
    const std::string& path,
    bool strict,
    const std::string& what,
    const std::vector<std::string>& rename,
    std::vector<std::string>* lines);

}  // namespace memtrain
