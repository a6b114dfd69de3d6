#include "memtrain/model/nets/swin_unetr.h"

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "memtrain/compat.h"
#include "memtrain/model/blocks/checkpointed.h"
#include "memtrain/model/registry.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

namespace nn = torch::nn;
using Dims = std::array<int64_t, 3>;

// Note [SwinUNETR as MONAI]
// Module for module after monai/networks/nets/swin_unetr.py and
// monai/networks/blocks/{unetr_block,dynunet_block}.py (MONAI 1.6.1), with
// their names: each MONAI module with parameters is a module here of the
// same name, registered in MONAI's order, so the parameters and the one
// buffer (each attention's relative_position_index, int64) come out in
// MONAI's state-dict order. What MONAI does, this does, in the same order
// of operations: in particular a window smaller than 7 where the feature
// map is (get_window_size: that axis then has no shift), the top-left
// n x n block of the relative position index for a window of n < 343
// tokens, the attention mask of compute_mask (-100 between regions),
// PatchMerging's order of the eight sub-grids (MONAI's "merging", not
// PatchMergingV2's), the hidden states layer-normalised without weights
// (normalize=True), LeakyReLU(0.01) in the residual blocks. Attention is
// kept_attention (checkpointed.h: blocked attention on LibTorch 1.13,
// Note [Blocked attention]): LibTorch 2.x's scaled_dot_product_attention, whose
// fused kernels need a 4-D (batch, heads) layout, so a shifted block's
// windows go in as (B, windows x heads, n, E) with the bias (the relative
// position bias plus the window's mask) per (window, head): the same
// attention, each (window, head) pair on its own.
//
// Note [SwinUNETR's faster form]
// Where kept_attention is blocked (LibTorch 1.13; the CPU on 2.x, whose
// flash kernel takes no bias), its backward computes each block's
// probabilities again, one more (q k^T) a block: at 64^3, feature 48,
// micro-batch 1 on the CPU build without checkpointing it peaked 9% lower
// than LibTorch's attention (2,536,707,584 B against 2,795,156,992) and
// its window took 8% longer (8279 against 7662 ms, medians of six
// alternating runs of two timed windows each: bench_memory --models
// swin_unetr --swin-feature 48 --volume-size 64 --unet-micro 1 --amp off
// --tiers off --form lean|faster, 1 thread). So it is the model's lean form
// (Classifier::has_lean_form): a run without memory.budget, or whose
// budget fits the faster form (Note [Planning the faster form]), runs
// compat::attention outside a selective checkpoint (a selective segment
// keeps kept_attention's output and lse), with or without gradients, so
// that a checkpointed segment's recomputation repeats its forward.
//
// Note [SwinUNETR's segments]
// The checkpoint segments are each Swin block (layersI.0.blocks.J; the
// last block of a stage with its patch merging), each encoder and each
// decoder block: 18, largest activations first. MONAI's use_checkpoint
// checkpoints inside each block; whole stages (memtrain's segments until
// 2026-12-01) recomputed both blocks of a stage at once in backward. A
// shifted block makes its attention mask inside its segment, so that the
// mask (161 MB at 96^3 in stage 1) is made again, not kept. Measured with
// the torch-2.11 build on the CPU (bench_memory --models swin_unetr
// --swin-feature 48 --volume-size 96 --unet-micro 1 --amp off -w 1 -n 2
// -c 0, 2 threads): every segment whole peaked at 3,299,126,784 B against
// 3,616,952,832 for stages (-8.8%; the accounting allocator's peaks are
// the same in every run), its window 18,985 ms (18,946-19,014) against
// 19,303 (19,238-21,398), medians of three alternating runs; selective
// 4,577,100,288 B against 4,548,899,328 (+0.6%: the first block's output
// is a segment input, kept), none unchanged (6,904,368,640).
//
// tests/e2e/
// swin_unetr_monai.sh builds MONAI's SwinUNETR with fixed weights and
// compares the names, shapes and order and the logits (fp32).

// MONAI's Convolution(conv_only=True): a module holding "conv".
template <typename Conv, typename Options>
struct HolderImpl : nn::Module {
  explicit HolderImpl(Options o) {
    conv = register_module("conv", Conv(std::move(o)));
  }
  Conv conv{nullptr};
};
using ConvHolderImpl = HolderImpl<nn::Conv3d, nn::Conv3dOptions>;
using UpHolderImpl =
    HolderImpl<nn::ConvTranspose3d, nn::ConvTranspose3dOptions>;

std::shared_ptr<ConvHolderImpl> conv_holder(
    int64_t in, int64_t out, int64_t k, bool bias) {
  return std::make_shared<ConvHolderImpl>(
      nn::Conv3dOptions(in, out, k).padding(k / 2).bias(bias));
}

// Layer norm in float32, as CUDA's autocast runs it (CPU autocast in
// LibTorch 1.13 would hand a bfloat16 input to float32 weights, which
// layer_norm refuses).
torch::Tensor fp32_norm(nn::LayerNorm& norm, const torch::Tensor& x) {
  return norm->forward(x.to(torch::kFloat32));
}

// InstanceNorm3d(affine=False): the statistics in float32 under autocast,
// the output in the input's dtype (CUDA's autocast runs instance_norm in
// the input's dtype; a float32 output would keep every residual block's
// output and skip in float32).
torch::Tensor instance_norm(const torch::Tensor& x) {
  return torch::instance_norm(
             x.to(torch::kFloat32), {}, {}, {}, {}, true, 0.1, 1e-5, false)
      .to(x.scalar_type());
}

// MONAI's UnetResBlock (kernel 3, stride 1, instance norm): lrelu(norm2(
// conv2(lrelu(norm1(conv1(x))))) + residual), the residual norm3(conv3(x))
// when the widths differ, else x.
struct ResBlockImpl : nn::Module {
  ResBlockImpl(int64_t in, int64_t out) {
    conv1 = register_module("conv1", conv_holder(in, out, 3, false));
    conv2 = register_module("conv2", conv_holder(out, out, 3, false));
    if (in != out)
      conv3 = register_module("conv3", conv_holder(in, out, 1, false));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h =
        torch::leaky_relu(instance_norm(kept_conv(conv1->conv, x)), 0.01);
    h = instance_norm(kept_conv(conv2->conv, h));
    const torch::Tensor r =
        conv3 ? instance_norm(kept_conv(conv3->conv, x)) : x;
    return torch::leaky_relu(h + r, 0.01);
  }

  std::shared_ptr<ConvHolderImpl> conv1, conv2, conv3;
};

// MONAI's UnetrBasicBlock(res_block=True): "layer", a UnetResBlock.
struct EncoderImpl : nn::Module {
  EncoderImpl(int64_t in, int64_t out) {
    layer = register_module("layer", std::make_shared<ResBlockImpl>(in, out));
  }
  std::shared_ptr<ResBlockImpl> layer;
};

// MONAI's UnetrUpBlock: conv_block(cat(transp_conv(x), skip)).
struct DecoderImpl : nn::Module {
  DecoderImpl(int64_t in, int64_t out) {
    transp_conv = register_module(
        "transp_conv",
        std::make_shared<UpHolderImpl>(
            nn::ConvTranspose3dOptions(in, out, 2).stride(2).bias(false)));
    conv_block = register_module(
        "conv_block", std::make_shared<ResBlockImpl>(2 * out, out));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& skip) {
    return conv_block->forward(
        torch::cat({transp_conv->conv->forward(x), skip}, 1));
  }

  std::shared_ptr<UpHolderImpl> transp_conv;
  std::shared_ptr<ResBlockImpl> conv_block;
};

// MONAI's UnetOutBlock: "conv", a Convolution of its own "conv" (1x1x1,
// with bias).
struct OutBlockImpl : nn::Module {
  OutBlockImpl(int64_t in, int64_t out) {
    conv = register_module("conv", conv_holder(in, out, 1, true));
  }
  std::shared_ptr<ConvHolderImpl> conv;
};

// (B, D, H, W, C) -> (B * windows, w0 * w1 * w2, C).
torch::Tensor window_partition(const torch::Tensor& x, const Dims& w) {
  const int64_t b = x.size(0), d = x.size(1), h = x.size(2), wd = x.size(3),
                c = x.size(4);
  return x.view({b, d / w[0], w[0], h / w[1], w[1], wd / w[2], w[2], c})
      .permute({0, 1, 3, 5, 2, 4, 6, 7})
      .contiguous()
      .view({-1, w[0] * w[1] * w[2], c});
}

// The inverse, to (B, D, H, W, C).
torch::Tensor window_reverse(
    const torch::Tensor& windows, const Dims& w, int64_t b, const Dims& dims) {
  return windows
      .view(
          {b,
           dims[0] / w[0],
           dims[1] / w[1],
           dims[2] / w[2],
           w[0],
           w[1],
           w[2],
           -1})
      .permute({0, 1, 4, 2, 5, 3, 6, 7})
      .contiguous()
      .view({b, dims[0], dims[1], dims[2], -1});
}

// The windows of a feature map of `size`: get_window_size (on an axis no
// longer than the window, the window is the axis and there is no shift),
// and the size padded up to whole windows.
struct Windows {
  Dims w, s, padded;
  bool shifted() const {
    return s[0] > 0 || s[1] > 0 || s[2] > 0;
  }
};

Windows windows_of(const Dims& size, const Dims& window, const Dims& shift) {
  Windows r{window, shift, {}};
  for (size_t a = 0; a < 3; ++a) {
    if (size[a] <= window[a]) {
      r.w[a] = size[a];
      r.s[a] = 0;
    }
    r.padded[a] = (size[a] + r.w[a] - 1) / r.w[a] * r.w[a];
  }
  return r;
}

// compute_mask: (windows, n, n), 0 within a region, -100 across. MONAI
// fills a host image with a region number per slice triple (slice(-w),
// slice(-w, -s), slice(-s, None) on each axis, numbered 9i + 3j + k) and
// copies it over; here the same numbers come from arange on `device`: on
// an axis of padded length n, [0, n-w) is slice 0, [n-w, n-s) 1, [n-s, n)
// 2 (an axis with no shift holds one window, so one slice: all equal).
// Nothing crosses from the host, so nothing waits for the device (a
// blocking copy in every forward and recomputation did). Made anew each
// forward (and recomputation): kept, the (windows, n, n) mask would hold
// 154 MiB of device memory between steps for the first stage of a 96^3
// patch.
torch::Tensor compute_mask(
    const Dims& dims,
    const Dims& w,
    const Dims& s,
    const torch::Device& device) {
  const auto opts = torch::TensorOptions().dtype(torch::kFloat).device(device);
  auto slice_of = [&](size_t a) {
    const torch::Tensor x = torch::arange(dims[a], opts);
    return x.ge(static_cast<double>(dims[a] - w[a])).to(torch::kFloat) +
           x.ge(static_cast<double>(dims[a] - s[a])).to(torch::kFloat);
  };
  const torch::Tensor img = (slice_of(0).view({dims[0], 1, 1}) * 9 +
                             slice_of(1).view({1, dims[1], 1}) * 3 +
                             slice_of(2).view({1, 1, dims[2]}))
                                .view({1, dims[0], dims[1], dims[2], 1});
  const torch::Tensor mw = window_partition(img, w).squeeze(-1);
  torch::Tensor mask = mw.unsqueeze(1) - mw.unsqueeze(2);
  return mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0);
}

// relative_position_index of a window: (n, n) int64.
torch::Tensor relative_position_index(const Dims& w) {
  const int64_t n = w[0] * w[1] * w[2];
  torch::Tensor index = torch::empty({n, n}, torch::kInt64);
  auto* p = index.data_ptr<int64_t>();
  auto coords = [&w](int64_t i) {
    return Dims{i / (w[1] * w[2]), (i / w[2]) % w[1], i % w[2]};
  };
  for (int64_t i = 0; i < n; ++i) {
    const Dims a = coords(i);
    for (int64_t j = 0; j < n; ++j) {
      const Dims b = coords(j);
      p[i * n + j] =
          (a[0] - b[0] + w[0] - 1) * (2 * w[1] - 1) * (2 * w[2] - 1) +
          (a[1] - b[1] + w[1] - 1) * (2 * w[2] - 1) + (a[2] - b[2] + w[2] - 1);
    }
  }
  return index;
}

struct WindowAttentionImpl : nn::Module {
  WindowAttentionImpl(int64_t dim, int64_t heads, const Dims& w)
      : heads(heads), scale(std::pow(double(dim / heads), -0.5)) {
    table = register_parameter(
        "relative_position_bias_table",
        torch::zeros(
            {(2 * w[0] - 1) * (2 * w[1] - 1) * (2 * w[2] - 1), heads}));
    index =
        register_buffer("relative_position_index", relative_position_index(w));
    qkv = register_module("qkv", nn::Linear(nn::LinearOptions(dim, 3 * dim)));
    proj = register_module("proj", nn::Linear(dim, dim));
    torch::NoGradGuard no_grad;
    table.normal_(0.0, 0.02).clamp_(-2.0, 2.0);  // MONAI's trunc_normal_
  }

  // x: (B * windows, n, C); mask: (windows, n, n) or undefined.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const int64_t b = x.size(0), n = x.size(1), c = x.size(2);
    const torch::Tensor qkv_ = kept_linear(qkv, x)
                                   .reshape({b, n, 3, heads, c / heads})
                                   .permute({2, 0, 3, 1, 4});
    torch::Tensor q = qkv_[0], k = qkv_[1], v = qkv_[2];
    const torch::Tensor rel =
        table
            .index_select(
                0, index.narrow(0, 0, n).narrow(1, 0, n).reshape({-1}))
            .reshape({n, n, -1})
            .permute({2, 0, 1})
            .contiguous();  // (heads, n, n)
    torch::Tensor out;
    if (mask.defined()) {
      // (B, windows x heads, n, E): each (window, head) pair attends on its
      // own, with its own bias (Note [SwinUNETR as MONAI]).
      const int64_t nw = mask.size(0), bb = b / nw, e = c / heads;
      // In q's dtype: under autocast no float32 copy of it is made.
      const torch::Tensor bias = (rel.to(q.scalar_type()).unsqueeze(0) +
                                  mask.unsqueeze(1).to(q.scalar_type()))
                                     .reshape({nw * heads, n, n});
      auto fold = [&](const torch::Tensor& t) {
        return t.reshape({bb, nw * heads, n, e});
      };
      out = attend(fold(q), fold(k), fold(v), bias).reshape({b, heads, n, e});
    } else {
      out = attend(q, k, v, rel);
    }
    return kept_linear(proj, out.transpose(1, 2).reshape({b, n, c}));
  }

  // Note [SwinUNETR's faster form]: not lean and outside a selective
  // checkpoint, LibTorch's attention, which keeps the probabilities for
  // backward; otherwise kept_attention, blocked where LibTorch's would
  // write them out. On 2.x's CPU the bias here is 3-D, which the flash
  // kernel does not take with or without gradients: a checkpoint's
  // no-grad first pass and its recomputation both run the math kernel
  // (FasterFormIsTheLeanOneToRounding holds them).
  torch::Tensor attend(
      const torch::Tensor& q,
      const torch::Tensor& k,
      const torch::Tensor& v,
      const torch::Tensor& bias) const {
    if (!lean && !keeping_outputs())
      return compat::attention(q, k, v, bias, scale);
    return kept_attention(q, k, v, bias, scale);
  }

  int64_t heads;
  double scale;
  bool lean = true;
  torch::Tensor table, index;
  nn::Linear qkv{nullptr}, proj{nullptr};
};

// MONAI's MLPBlock (dropout_mode "swin", no dropout): linear2(gelu(linear1)).
struct MlpImpl : nn::Module {
  MlpImpl(int64_t dim, int64_t hidden) {
    linear1 = register_module("linear1", nn::Linear(dim, hidden));
    linear2 = register_module("linear2", nn::Linear(hidden, dim));
  }
  nn::Linear linear1{nullptr}, linear2{nullptr};
};

struct BlockImpl : nn::Module {
  BlockImpl(int64_t dim, int64_t heads, const Dims& window, const Dims& shift)
      : window(window), shift(shift) {
    norm1 = register_module(
        "norm1", nn::LayerNorm(nn::LayerNormOptions({dim}).eps(1e-5)));
    attn = register_module(
        "attn", std::make_shared<WindowAttentionImpl>(dim, heads, window));
    norm2 = register_module(
        "norm2", nn::LayerNorm(nn::LayerNormOptions({dim}).eps(1e-5)));
    mlp = register_module("mlp", std::make_shared<MlpImpl>(dim, 4 * dim));
  }

  // x: (B, D, H, W, C).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const int64_t b = x.size(0), c = x.size(4);
    const Dims size = {x.size(1), x.size(2), x.size(3)};
    const Windows win = windows_of(size, window, shift);
    const Dims &w = win.w, &s = win.s, &padded = win.padded;
    torch::Tensor h = fp32_norm(norm1, x);
    if (padded != size) {
      h = torch::constant_pad_nd(
          h,
          {0,
           0,
           0,
           padded[2] - size[2],
           0,
           padded[1] - size[1],
           0,
           padded[0] - size[0]});
    }
    const bool shifted = win.shifted();
    if (shifted)
      h = torch::roll(h, {-s[0], -s[1], -s[2]}, {1, 2, 3});
    h = attn->forward(window_partition(h, w), shifted ? mask : torch::Tensor());
    h = window_reverse(h.view({-1, w[0], w[1], w[2], c}), w, b, padded);
    if (shifted)
      h = torch::roll(h, {s[0], s[1], s[2]}, {1, 2, 3});
    if (padded != size) {
      h = h.narrow(1, 0, size[0])
              .narrow(2, 0, size[1])
              .narrow(3, 0, size[2])
              .contiguous();
    }
    torch::Tensor y = x + h;
    return y + kept_linear(
                   mlp->linear2,
                   torch::gelu(kept_linear(mlp->linear1, fp32_norm(norm2, y))));
  }

  Dims window, shift;
  nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  std::shared_ptr<WindowAttentionImpl> attn;
  std::shared_ptr<MlpImpl> mlp;
};

// MONAI's PatchMerging (3D): the eight sub-grids in its order,
// concatenated, layer-normed, reduced to 2 dim.
struct MergingImpl : nn::Module {
  explicit MergingImpl(int64_t dim) {
    reduction = register_module(
        "reduction",
        nn::Linear(nn::LinearOptions(8 * dim, 2 * dim).bias(false)));
    norm = register_module(
        "norm", nn::LayerNorm(nn::LayerNormOptions({8 * dim}).eps(1e-5)));
  }

  // MONAI pads an odd axis first; none is odd here (every input axis is a
  // multiple of 32, SwinUnetr::check_input).
  torch::Tensor forward(const torch::Tensor& x) {  // (B, D, H, W, C)
    MT_INTERNAL_ASSERT(
        x.size(1) % 2 == 0 && x.size(2) % 2 == 0 && x.size(3) % 2 == 0,
        "patch merging of ",
        x.sizes());
    static constexpr int64_t kOrder[8][3] = {
        {0, 0, 0},
        {1, 0, 0},
        {0, 1, 0},
        {0, 0, 1},
        {1, 1, 0},
        {1, 0, 1},
        {0, 1, 1},
        {1, 1, 1}};
    std::vector<torch::Tensor> parts;
    for (const auto& o : kOrder) {
      parts.push_back(x.slice(1, o[0], c10::nullopt, 2)
                          .slice(2, o[1], c10::nullopt, 2)
                          .slice(3, o[2], c10::nullopt, 2));
    }
    return kept_linear(reduction, fp32_norm(norm, torch::cat(parts, -1)));
  }

  nn::Linear reduction{nullptr};
  nn::LayerNorm norm{nullptr};
};

// MONAI's BasicLayer: the blocks (unshifted, shifted, ...) and the merging.
struct StageImpl : nn::Module {
  StageImpl(int64_t dim, int64_t depth, int64_t heads) {
    blocks = register_module("blocks", nn::ModuleList());
    for (int64_t i = 0; i < depth; ++i) {
      blocks->push_back(std::make_shared<BlockImpl>(
          dim, heads, kWindow, i % 2 == 0 ? Dims{0, 0, 0} : kShift));
    }
    downsample =
        register_module("downsample", std::make_shared<MergingImpl>(dim));
  }

  // Block j of an input (B, C, D, H, W) for the first, of the previous
  // block's output (B, D, H, W, C) otherwise; the last block's output goes
  // through the merging: (B, 2C, D/2, H/2, W/2). Running them in order is
  // MONAI's BasicLayer; each is one segment of SwinUnetr (Note
  // [SwinUNETR's segments]). A shifted block makes its mask (MONAI's
  // compute_mask, the stage's) itself, so that a checkpointed block's
  // recomputation makes it again rather than keep it from the forward.
  torch::Tensor block(size_t j, const torch::Tensor& x) {
    BlockImpl* b = blocks[j]->as<BlockImpl>();
    const torch::Tensor in = j == 0 ? x.permute({0, 2, 3, 4, 1}) : x;
    const Windows win =
        windows_of({in.size(1), in.size(2), in.size(3)}, b->window, b->shift);
    torch::Tensor mask;
    if (win.shifted()) {
      torch::NoGradGuard no_grad;
      mask = compute_mask(win.padded, win.w, win.s, in.device());
    }
    const torch::Tensor y = b->forward(in, mask);
    if (j + 1 < blocks->size())
      return y;
    return downsample->forward(y).permute({0, 4, 1, 2, 3});
  }

  static constexpr Dims kWindow = {7, 7, 7};
  static constexpr Dims kShift = {3, 3, 3};
  nn::ModuleList blocks{nullptr};
  std::shared_ptr<MergingImpl> downsample;
};

struct PatchEmbedImpl : nn::Module {
  PatchEmbedImpl(int64_t in, int64_t dim) {
    proj = register_module(
        "proj", nn::Conv3d(nn::Conv3dOptions(in, dim, 2).stride(2)));
  }
  nn::Conv3d proj{nullptr};
};

// MONAI's SwinTransformer: patch_embed and layers1..layers4.
struct SwinViTImpl : nn::Module {
  SwinViTImpl(int64_t in, int64_t f) {
    patch_embed =
        register_module("patch_embed", std::make_shared<PatchEmbedImpl>(in, f));
    const int64_t heads[4] = {3, 6, 12, 24};
    for (int64_t i = 0; i < 4; ++i) {
      auto list =
          register_module("layers" + std::to_string(i + 1), nn::ModuleList());
      list->push_back(std::make_shared<StageImpl>(f << i, 2, heads[i]));
      layers[i] = list;
    }
  }
  std::shared_ptr<PatchEmbedImpl> patch_embed;
  std::array<nn::ModuleList, 4> layers{nullptr, nullptr, nullptr, nullptr};
};

// proj_out(normalize=True): layer norm over channels, no weights.
torch::Tensor proj_out(const torch::Tensor& x) {
  const int64_t c = x.size(1);
  return torch::layer_norm(x.permute({0, 2, 3, 4, 1}).to(torch::kFloat32), {c})
      .permute({0, 4, 1, 2, 3});
}

class SwinUnetr : public Classifier {
 public:
  SwinUnetr(int64_t in_channels, int64_t f, int64_t num_classes)
      : in_channels_(in_channels) {
    vit_ = register_module(
        "swinViT", std::make_shared<SwinViTImpl>(in_channels, f));
    const std::pair<const char*, std::array<int64_t, 2>> enc[] = {
        {"encoder1", {in_channels, f}},
        {"encoder2", {f, f}},
        {"encoder3", {2 * f, 2 * f}},
        {"encoder4", {4 * f, 4 * f}},
        {"encoder10", {16 * f, 16 * f}}};
    for (const auto& [name, io] : enc) {
      enc_.push_back(
          register_module(name, std::make_shared<EncoderImpl>(io[0], io[1])));
    }
    const std::pair<const char*, std::array<int64_t, 2>> dec[] = {
        {"decoder5", {16 * f, 8 * f}},
        {"decoder4", {8 * f, 4 * f}},
        {"decoder3", {4 * f, 2 * f}},
        {"decoder2", {2 * f, f}},
        {"decoder1", {f, f}}};
    for (const auto& [name, io] : dec) {
      dec_.push_back(
          register_module(name, std::make_shared<DecoderImpl>(io[0], io[1])));
    }
    out_ =
        register_module("out", std::make_shared<OutBlockImpl>(f, num_classes));
    // Largest activations first; each Swin block a segment (Note
    // [SwinUNETR's segments]).
    const auto stage_blocks = [this](int64_t stage) {
      std::vector<std::string> names;
      const size_t depth =
          vit_->layers[stage][0]->as<StageImpl>()->blocks->size();
      for (size_t j = 0; j < depth; ++j)
        names.push_back(block_segment(stage, j));
      return names;
    };
    for (const auto& part : std::vector<std::vector<std::string>>{
             stage_blocks(0),
             {"decoder1", "encoder1", "decoder2", "encoder2"},
             stage_blocks(1),
             {"decoder3", "encoder3"},
             stage_blocks(2),
             {"decoder4", "encoder4"},
             stage_blocks(3),
             {"decoder5", "encoder10"}}) {
      segment_names_.insert(segment_names_.end(), part.begin(), part.end());
    }
  }

  using Classifier::forward;

  // Note [SwinUNETR's faster form]. On a GPU kept_attention is LibTorch's
  // fused attention either way: one form.
  bool has_lean_form() const override {
    return !out_->conv->conv->weight.is_cuda();
  }
  void set_memory_lean(bool lean) override {
    for (const auto& m : modules(/*include_self=*/false)) {
      if (auto* a = dynamic_cast<WindowAttentionImpl*>(m.get()))
        a->lean = lean;
    }
  }

  torch::Tensor forward(torch::Tensor x) override {
    check_input(x);
    // The hidden states: patch embedding, then each stage's output.
    std::array<torch::Tensor, 5> hidden;
    torch::Tensor h = vit_->patch_embed->proj->forward(x);
    hidden[0] = proj_out(h);
    for (int64_t i = 0; i < 4; ++i) {
      StageImpl* stage = vit_->layers[i][0]->as<StageImpl>();
      h = h.contiguous();
      for (size_t j = 0; j < stage->blocks->size(); ++j) {
        h =
            run(block_segment(i, j),
                {h},
                [stage, j](const std::vector<at::Tensor>& t) {
                  return stage->block(j, t[0]);
                });
      }
      hidden[i + 1] = proj_out(h);
    }
    h = torch::Tensor();
    auto encode =
        [this](size_t i, const std::string& name, const torch::Tensor& t) {
          ResBlockImpl* b = enc_[i]->layer.get();
          return run(name, {t}, [b](const std::vector<at::Tensor>& in) {
            return b->forward(in[0]);
          });
        };
    const torch::Tensor enc0 = encode(0, "encoder1", x);
    const torch::Tensor enc1 = encode(1, "encoder2", hidden[0]);
    const torch::Tensor enc2 = encode(2, "encoder3", hidden[1]);
    const torch::Tensor enc3 = encode(3, "encoder4", hidden[2]);
    torch::Tensor d = encode(4, "encoder10", hidden[4]);
    const std::array<torch::Tensor, 5> skips = {
        hidden[3], enc3, enc2, enc1, enc0};
    for (size_t i = 0; i < 5; ++i) {
      DecoderImpl* b = dec_[i].get();
      d =
          run("decoder" + std::to_string(5 - i),
              {d, skips[i]},
              [b](const std::vector<at::Tensor>& in) {
                return b->forward(in[0], in[1]);
              });
    }
    return out_->conv->conv->forward(d);
  }

 private:
  // fn(xs), checkpointed when segment `name` is among the first
  // checkpointed() of segment_names_. With offload the last block of the
  // forward (decoder1: its inputs are the first backward needs) keeps its
  // inputs on the device.
  torch::Tensor run(
      const std::string& name,
      const std::vector<torch::Tensor>& xs,
      const SegmentN& fn) {
    int64_t rank = 0;
    while (segment_names_[rank] != name)
      ++rank;
    if (rank >= checkpointed())
      return fn(xs);
    const Recompute mode =
        recompute() == Recompute::kAllOffload && name == "decoder1"
            ? Recompute::kAll
            : recompute();
    return checkpoint(fn, xs, mode);
  }

  // The segment of block j of stage i (0-based): its module's path,
  // "layers1.0.blocks.0" ...; the last block's includes the merging.
  static std::string block_segment(int64_t stage, size_t j) {
    return "layers" + std::to_string(stage + 1) + ".0.blocks." +
           std::to_string(j);
  }

  void check_input(const torch::Tensor& x) const {
    MT_CHECK(
        x.dim() == 5 && x.size(1) == in_channels_,
        "swin_unetr: expected an input (N, ",
        in_channels_,
        ", D, H, W), got shape ",
        x.sizes());
    for (int64_t a = 2; a < 5; ++a) {
      MT_CHECK(
          x.size(a) % kSwinUnetrDivisor == 0,
          "swin_unetr: input of shape ",
          x.sizes(),
          ": D, H and W must be multiples of 32 (MONAI's SwinUNETR halves "
          "them 5 times); use data.patch_size and validation.roi values "
          "that are multiples of 32");
    }
    MT_CHECK(
        x.size(2) * x.size(3) * x.size(4) > 32 * 32 * 32,
        "swin_unetr: input of shape ",
        x.sizes(),
        " leaves one voxel at 1/32, whose instance norm has no statistics; "
        "make one axis 64 or more");
  }

  int64_t in_channels_;
  std::shared_ptr<SwinViTImpl> vit_;
  std::vector<std::shared_ptr<EncoderImpl>> enc_;
  std::vector<std::shared_ptr<DecoderImpl>> dec_;
  std::shared_ptr<OutBlockImpl> out_;
};

}  // namespace

std::shared_ptr<Classifier> make_swin_unetr(
    const ModelConfig& cfg, int64_t in_channels, int64_t num_classes) {
  const int64_t f = model_feature_size(cfg);
  MT_CHECK(
      f >= 12 && f % 12 == 0,
      "model.feature_size=",
      f,
      ": swin_unetr needs a multiple of 12 (MONAI's rule: its stages' "
      "widths f, 2f, 4f, 8f divide among 3, 6, 12 and 24 heads); 48 is "
      "MONAI's BTCV setting, 12 or 24 a small one");
  MT_CHECK(
      in_channels >= 1 && num_classes >= 1,
      "swin_unetr: needs at least one input channel and one class, got ",
      in_channels,
      " channel(s) and ",
      num_classes,
      " class(es)");
  return std::make_shared<SwinUnetr>(in_channels, f, num_classes);
}

namespace detail {

torch::Tensor swin_shift_mask(
    const std::array<int64_t, 3>& padded,
    const std::array<int64_t, 3>& window,
    const std::array<int64_t, 3>& shift,
    const c10::Device& device) {
  return compute_mask(padded, window, shift, device);
}

}  // namespace detail

}  // namespace memtrain
