#include "memtrain/model/blocks/fused_attention.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>

#include "memtrain/compat.h"
#include "memtrain/util/error.h"

#if MEMTRAIN_TORCH_AT_LEAST(2, 4)
#include <ATen/SDPBackend.h>
#include <ATen/autocast_mode.h>
#endif

// Note [Kept fused attention]
// A selective checkpoint keeps the outputs of a segment's matrix products
// and recomputes the cheap ops between them (Note [Selective recompute]).
// Attention is a matrix product too, but LibTorch 2.x's
// scaled_dot_product_attention is one op whose fused kernels (flash on the
// CPU; flash, memory-efficient or cuDNN on a GPU) save their own output
// and log-sum-exp inside an autograd node of their own: a checkpoint that
// keeps only tensors had to run the whole attention again in backward.
// Here it is called as scaled_dot_product_attention calls it
// (aten/src/ATen/native/transformers/attention.cpp, torch 2.11): the
// backend from at::_fused_sdp_choice, asked as the forward with gradients
// asks it (a checkpoint's first pass runs without them, and on a GPU the
// choice depends on it), then that backend's op; the output and what its
// backward needs (the log-sum-exp; on CUDA the RNG seed and offset, unused
// without dropout) are kept, and the node made here calls the backend's
// own backward op with the same arguments as LibTorch's derivative of the
// kernel (tools/autograd/derivatives.yaml). So the gradients are those of
// scaled_dot_product_attention bit for bit, and a selective segment's
// recomputation runs no attention. Kept: the CPU's flash kernel (no
// padding there); on CUDA flash where the head size is a multiple of 8
// (scaled_dot_product_attention pads other sizes and slices the output)
// and memory-efficient without a bias (with one it aligns the bias through
// a helper of its own). Everything else (the math and cuDNN kernels, a
// bias on CUDA, inputs not in an active autocast's dtype, LibTorch 1.13)
// is computed by the caller: kept_attention recomputes
// compat::attention, or on the CPU with a bias and on 1.13 keeps its own
// blocked attention (Note [Blocked attention]). The CPU path is tested
// (Transformer.SelectiveBlocksKeepTheirAttention: gradients equal to no
// checkpointing bit for bit, no attention op in a selective backward);
// the CUDA paths are written and compiled, not run: no GPU was lent.
// What is kept costs memory: CLIP ViT-B-32 at 16 pairs, fp32, every block
// selective peaked at 2,520,477,184 B against 2,462,337,024 with the
// attention recomputed (+58 MB: each block's output and log-sum-exp; none
// 2,807,102,976, every block whole 1,965,839,872), bench_memory --models
// clip --clip-micro 16 --amp off --tiers off,selective,all on the
// torch-2.11 build; the peaks are exact, the times (other work ran beside
// it) were not compared.

namespace memtrain {

#if MEMTRAIN_TORCH_AT_LEAST(2, 4)

namespace {

using at::SDPBackend;

struct FusedAttentionBackward : torch::autograd::Node {
  torch::autograd::SavedVariable q, k, v, out;  // edges: q, k, v
  std::vector<at::Tensor> aux;
  int64_t backend = 0;
  double scale = 1;
  bool causal = false;

  std::string name() const override {
    return "memtrain::FusedAttentionBackward";
  }

  void release_variables() override {
    q.reset_data();
    k.reset_data();
    v.reset_data();
    out.reset_data();
    aux.clear();
  }

  torch::autograd::variable_list apply(
      torch::autograd::variable_list&& grads) override {
    torch::autograd::variable_list result(3);
    if (grads.empty() || !grads[0].defined())
      return result;
    MT_CHECK(
        !torch::GradMode::is_enabled(),
        "attention: a gradient of its gradient (create_graph) is not "
        "supported by the kept fused attention");
    const std::shared_ptr<Node> self = shared_from_this();
    const at::Tensor qt = q.unpack(), kt = k.unpack(), vt = v.unpack();
    const at::Tensor o = out.unpack(self);
    std::tuple<at::Tensor, at::Tensor, at::Tensor> g;
    switch (static_cast<SDPBackend>(backend)) {
      case SDPBackend::flash_attention:
        if (qt.is_cuda()) {
          g = at::_scaled_dot_product_flash_attention_backward(
              grads[0],
              qt,
              kt,
              vt,
              o,
              aux.at(0),
              at::Tensor(),
              at::Tensor(),
              qt.size(-2),
              kt.size(-2),
              0.0,
              causal,
              aux.at(1),
              aux.at(2),
              scale);
        } else {
          g = at::_scaled_dot_product_flash_attention_for_cpu_backward(
              grads[0], qt, kt, vt, o, aux.at(0), 0.0, causal, {}, scale);
        }
        break;
      case SDPBackend::efficient_attention: {
        const auto e = at::_scaled_dot_product_efficient_attention_backward(
            grads[0],
            qt,
            kt,
            vt,
            at::Tensor(),
            o,
            aux.at(0),
            aux.at(1),
            aux.at(2),
            0.0,
            {should_compute_output(0),
             should_compute_output(1),
             should_compute_output(2),
             false},
            causal,
            scale);
        g = {std::get<0>(e), std::get<1>(e), std::get<2>(e)};
        break;
      }
      default:
        MT_INTERNAL_ASSERT(false, "kept fused attention of backend ", backend);
    }
    result[0] = std::get<0>(g);
    result[1] = std::get<1>(g);
    result[2] = std::get<2>(g);
    return result;
  }
};

// The backend scaled_dot_product_attention takes for q, k, v with
// gradients (each input requiring one, grad mode on).
SDPBackend backend_with_gradients(
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    const std::optional<at::Tensor>& mask,
    double scale,
    bool causal) {
  torch::AutoGradMode grad(true);
  const at::Tensor qg = q.detach().requires_grad_(true);
  const at::Tensor kg = k.detach().requires_grad_(true);
  const at::Tensor vg = v.detach().requires_grad_(true);
  return static_cast<SDPBackend>(
      at::_fused_sdp_choice(qg, kg, vg, mask, 0.0, causal, scale));
}

}  // namespace

std::optional<FusedAttentionForward> fused_attention_forward(
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    const at::Tensor& bias,
    double scale,
    bool causal) {
  const at::DeviceType device = q.device().type();
  if (device != at::kCPU && device != at::kCUDA)
    return std::nullopt;
  // scaled_dot_product_attention is an autocast op: under autocast its
  // inputs are cast first. Kept only where they already have that dtype.
  if (at::autocast::is_autocast_enabled(device)) {
    const at::ScalarType low = at::autocast::get_autocast_dtype(device);
    if (q.scalar_type() != low || k.scalar_type() != low ||
        v.scalar_type() != low)
      return std::nullopt;
  }
  if (bias.defined() && device == at::kCUDA)
    return std::nullopt;
  std::optional<at::Tensor> mask;
  if (bias.defined())
    mask = bias.to(q.scalar_type());
  const SDPBackend backend =
      backend_with_gradients(q, k, v, mask, scale, causal);
  FusedAttentionForward fwd;
  fwd.backend = static_cast<int64_t>(backend);
  if (backend == SDPBackend::flash_attention && device == at::kCPU) {
    auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal, mask, scale);
    fwd.out = std::move(out);
    fwd.aux = {std::move(lse)};
    return fwd;
  }
  if (backend == SDPBackend::flash_attention && q.size(-1) % 8 == 0) {
    auto r = at::_scaled_dot_product_flash_attention(
        q, k, v, 0.0, causal, /*return_debug_mask=*/false, scale);
    fwd.out = std::get<0>(r);
    fwd.aux = {std::get<1>(r), std::get<6>(r), std::get<7>(r)};
    return fwd;
  }
  if (backend == SDPBackend::efficient_attention) {
    auto r = at::_scaled_dot_product_efficient_attention(
        q, k, v, std::nullopt, /*compute_log_sumexp=*/true, 0.0, causal, scale);
    fwd.out = std::get<0>(r);
    fwd.aux = {std::get<1>(r), std::get<2>(r), std::get<3>(r)};
    return fwd;
  }
  return std::nullopt;
}

at::Tensor fused_attention(
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    double scale,
    bool causal,
    FusedAttentionForward fwd) {
  MT_INTERNAL_ASSERT(fwd.out.defined(), "fused_attention without a forward");
  at::Tensor out = fwd.out.detach();
  const bool any = q.requires_grad() || k.requires_grad() || v.requires_grad();
  if (!torch::GradMode::is_enabled() || !any)
    return out;
  auto node = std::shared_ptr<FusedAttentionBackward>(
      new FusedAttentionBackward(), torch::autograd::deleteNode);
  node->q = torch::autograd::SavedVariable(q, /*is_output=*/false);
  node->k = torch::autograd::SavedVariable(k, /*is_output=*/false);
  node->v = torch::autograd::SavedVariable(v, /*is_output=*/false);
  node->aux = std::move(fwd.aux);
  node->backend = fwd.backend;
  node->scale = scale;
  node->causal = causal;
  node->set_next_edges(torch::autograd::collect_next_edges(q, k, v));
  torch::autograd::set_history(out, node);
  node->out = torch::autograd::SavedVariable(out, /*is_output=*/true);
  return out;
}

#else  // LibTorch 1.13: no fused kernels

std::optional<FusedAttentionForward> fused_attention_forward(
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    double,
    bool) {
  return std::nullopt;
}

at::Tensor fused_attention(
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    double,
    bool,
    FusedAttentionForward) {
  MT_INTERNAL_ASSERT(false, "fused_attention on LibTorch 1.13");
  return at::Tensor();
}

#endif

}  // namespace memtrain
