#include "memtrain/model/nets/unet3d.h"

#include <utility>

#include "memtrain/model/blocks/checkpointed.h"
#include "memtrain/model/registry.h"
#include "memtrain/util/error.h"

namespace memtrain {

namespace {

// An empty AnyModule for Norm::kNone.
torch::nn::AnyModule make_norm(Norm kind, int64_t channels) {
  switch (kind) {
    case Norm::kInstance:
      return torch::nn::AnyModule(torch::nn::InstanceNorm3d(
          torch::nn::InstanceNormOptions(channels).affine(true)));
    case Norm::kGroup:
      return torch::nn::AnyModule(torch::nn::GroupNorm(
          torch::nn::GroupNormOptions(groups_for(channels), channels)));
    case Norm::kNone:
      break;
  }
  return {};
}

torch::nn::Conv3d conv3(int64_t in, int64_t out, bool bias) {
  return torch::nn::Conv3d(
      torch::nn::Conv3dOptions(in, out, 3).padding(1).bias(bias));
}

// relu(norm2(conv2(relu(norm1(conv1(x))))) + shortcut(x)).
struct ResBlockImpl : torch::nn::Module {
  ResBlockImpl(int64_t in, int64_t out, Norm norm) {
    const bool has_norm = norm != Norm::kNone;
    conv1 = register_module("conv1", conv3(in, out, !has_norm));
    norm1 = make_norm(norm, out);
    if (has_norm)
      register_module("norm1", norm1.ptr());
    conv2 = register_module("conv2", conv3(out, out, !has_norm));
    norm2 = make_norm(norm, out);
    if (has_norm)
      register_module("norm2", norm2.ptr());
    if (in != out) {
      proj = register_module(
          "proj", torch::nn::Conv3d(torch::nn::Conv3dOptions(in, out, 1)));
    }
  }

  // The block on its input xs = {x}, or on the concatenation of xs =
  // {upsampled, skip} along channels without making it: conv1 and the
  // projection run on each part with their slice of the weights (halves),
  // and the sums are the convolutions of the concatenation. See Note
  // [U-Net decoder input].
  // The shortcut comes first: see Note [U-Net block order].
  torch::Tensor forward(const std::vector<torch::Tensor>& xs) {
    torch::Tensor s = shortcut(xs);
    return join(s, second(first(xs)));
  }

  torch::Tensor shortcut(const std::vector<torch::Tensor>& xs) {
    return proj ? on_input(proj, xs, 0) : xs[0];
  }

  // relu(norm1(conv1(xs))).
  torch::Tensor first(const std::vector<torch::Tensor>& xs) {
    return torch::relu(normed(norm1, on_input(conv1, xs, 1)));
  }

  // norm2(conv2(h)).
  torch::Tensor second(const torch::Tensor& h) {
    return normed(norm2, kept_conv(conv2, h));
  }

  // relu(h + s), in place on the projection's output when there is one of
  // h's type (its own tensor, which nothing saved, unless a selective
  // checkpoint keeps it); else on the fresh sum.
  torch::Tensor join(torch::Tensor s, const torch::Tensor& h) {
    if (proj && s.scalar_type() == h.scalar_type() && !keeping_outputs())
      return torch::relu_(s.add_(h));
    torch::Tensor sum = h + s;
    return torch::relu_(sum);
  }

  static torch::Tensor on_input(
      torch::nn::Conv3d& conv,
      const std::vector<torch::Tensor>& xs,
      int64_t padding) {
    if (xs.size() == 1)
      return kept_conv(conv, xs[0]);
    MT_INTERNAL_ASSERT(xs.size() == 2, "a block of one or two inputs");
    return halves(conv, xs[0], xs[1], padding);
  }

  static torch::Tensor halves(
      torch::nn::Conv3d& conv,
      const torch::Tensor& a,
      const torch::Tensor& b,
      int64_t padding) {
    const torch::Tensor& w = conv->weight;
    const int64_t ca = a.size(1);
    const int64_t one[] = {1, 1, 1};
    const int64_t pad[] = {padding, padding, padding};
    // One kept output, the sum (a selective checkpoint keeps it).
    return kept_conv_sum(
        {{b, w.narrow(1, ca, w.size(1) - ca), conv->bias},
         {a, w.narrow(1, 0, ca), {}}},
        one,
        pad,
        one,
        1);
  }

  static torch::Tensor normed(torch::nn::AnyModule& norm, torch::Tensor h) {
    if (norm.is_empty())
      return h;
    return norm.forward(h.to(torch::kFloat32));  // fp32 under autocast
  }

  torch::nn::Conv3d conv1{nullptr}, conv2{nullptr}, proj{nullptr};
  torch::nn::AnyModule norm1, norm2;
};
TORCH_MODULE(ResBlock);

class UNet3d : public Classifier {
 public:
  UNet3d(const ModelConfig& cfg, int64_t in_channels, int64_t num_classes)
      : depth_(cfg.depth),
        in_channels_(in_channels),
        divisor_(unet3d_divisor(cfg.depth)) {
    const int64_t f = model_feature_size(cfg);
    enc_ = register_module("enc", torch::nn::ModuleList());
    up_ = register_module("up", torch::nn::ModuleList());
    dec_ = register_module("dec", torch::nn::ModuleList());
    for (int64_t l = 0; l < depth_; ++l) {
      const int64_t in = l == 0 ? in_channels : f << (l - 1);
      enc_->push_back(ResBlock(in, f << l, cfg.norm));
    }
    for (int64_t l = 0; l + 1 < depth_; ++l) {
      up_->push_back(torch::nn::ConvTranspose3d(
          torch::nn::ConvTranspose3dOptions(f << (l + 1), f << l, 2)
              .stride(2)));
      dec_->push_back(ResBlock(2 * (f << l), f << l, cfg.norm));
    }
    head_ = register_module(
        "head", torch::nn::Conv3d(torch::nn::Conv3dOptions(f, num_classes, 1)));

    // See Note [U-Net segment order].
    enc_rank_.resize(depth_);
    dec_rank_.resize(depth_ - 1);
    for (int64_t l = 0; l < depth_; ++l) {
      enc_rank_[l] = num_segments();
      segment_names_.push_back("enc." + std::to_string(l));
      if (l + 1 < depth_) {
        dec_rank_[l] = num_segments();
        segment_names_.push_back("dec." + std::to_string(l));
      }
    }
  }

  using Classifier::forward;

  torch::Tensor forward(torch::Tensor x) override {
    check_input(x);
    std::vector<torch::Tensor> skips;
    for (int64_t l = 0; l < depth_; ++l) {
      // The pool runs inside the segments: its output and indices are
      // dropped, the unpooled input is the skip kept anyway.
      x = run(block(enc_, l), enc_rank_[l], l > 0, depth_ == 1, {x});
      if (l + 1 < depth_)
        skips.push_back(x);
    }
    for (int64_t l = depth_ - 2; l >= 0; --l) {
      torch::Tensor up =
          up_[l]->as<torch::nn::ConvTranspose3dImpl>()->forward(x);
      // See Note [U-Net decoder input]: split when lean, and without
      // gradients (validation, inference), where it is also the faster.
      std::vector<torch::Tensor> in;
      if (lean_ || !torch::GradMode::is_enabled()) {
        in = {up, std::move(skips[l])};
      } else {
        in = {torch::cat({up, skips[l]}, 1)};
        skips[l] = torch::Tensor();
      }
      up = torch::Tensor();
      x = run(block(dec_, l), dec_rank_[l], false, l == 0, in);
    }
    return head_(x);
  }

  bool has_lean_form() const override {
    return depth_ > 1;  // one level has no decoder
  }
  void set_memory_lean(bool lean) override {
    lean_ = lean;
  }

 private:
  static ResBlockImpl* block(torch::nn::ModuleList& list, int64_t i) {
    return list[i]->as<ResBlockImpl>();
  }

  // Block b on xs (max-pooled first when `pool`), checkpointed when its
  // segment `rank` is below checkpointed(). A pooled block is one
  // checkpoint (only its unpooled input is kept); any other keeps its
  // shortcut outside and checkpoints its main path, in two pieces when it
  // is the last block of the forward. See Note [U-Net checkpoints].
  torch::Tensor run(
      ResBlockImpl* b,
      int64_t rank,
      bool pool,
      bool last,
      const std::vector<torch::Tensor>& xs) {
    const auto whole = [b, pool](const std::vector<at::Tensor>& t) {
      return b->forward(
          pool ? std::vector<torch::Tensor>{torch::max_pool3d(t[0], 2)} : t);
    };
    if (rank >= checkpointed())
      return whole(xs);
    // With offload, a block's inputs leave the device only when no saved
    // tensor keeps them: the projection is a checkpoint of its own too
    // (sharing the inputs' host copy). The last block's inputs are the
    // first backward needs: they stay (kAll).
    const bool offload = recompute() == Recompute::kAllOffload;
    const Recompute mode = offload && last ? Recompute::kAll : recompute();
    if (pool)
      return checkpoint(whole, xs, mode);
    torch::Tensor s = offload && !last && b->proj
                          ? checkpoint(
                                [b](const std::vector<at::Tensor>& t) {
                                  return b->shortcut(t);
                                },
                                xs,
                                mode)
                          : b->shortcut(xs);
    torch::Tensor h;
    if (last) {
      h = checkpoint(
          [b](const at::Tensor& t) { return b->second(t); },
          checkpoint(
              [b](const std::vector<at::Tensor>& t) { return b->first(t); },
              xs,
              mode),
          mode);
    } else {
      h = checkpoint(
          [b](const std::vector<at::Tensor>& t) {
            return b->second(b->first(t));
          },
          xs,
          mode);
    }
    return b->join(s, h);
  }

  void check_input(const torch::Tensor& x) const {
    MT_CHECK(
        x.dim() == 5,
        "unet3d: expected an input (N, C, D, H, W), got shape ",
        x.sizes(),
        "; model.name=unet3d needs a /volumes file");
    MT_CHECK(
        x.size(1) == in_channels_,
        "unet3d: input of shape ",
        x.sizes(),
        " has ",
        x.size(1),
        " channels, the model was built for ",
        in_channels_,
        " (model.in_channels)");
    for (int64_t d = 2; d < 5; ++d) {
      MT_CHECK(
          x.size(d) % divisor_ == 0,
          "unet3d: input of shape ",
          x.sizes(),
          ": D, H and W must be multiples of ",
          divisor_,
          " = 2^(model.depth-1) with model.depth=",
          depth_,
          ", but ",
          x.size(d),
          " is not; use data.patch_size and validation.roi values that are "
          "multiples of ",
          divisor_,
          " (e.g. ",
          (x.size(d) + divisor_ - 1) / divisor_ * divisor_,
          " instead of ",
          x.size(d),
          "), or a smaller model.depth");
    }
  }

  int64_t depth_;
  int64_t in_channels_;
  int64_t divisor_;
  bool lean_ = true;  // the decoder's input split (Note [U-Net decoder input])
  torch::nn::ModuleList enc_{nullptr}, up_{nullptr}, dec_{nullptr};
  torch::nn::Conv3d head_{nullptr};
  std::vector<int64_t> enc_rank_, dec_rank_;  // positions in segment_names_
};

// Note [U-Net segment order]
// Checkpointing a segment drops the activations inside it; its input is
// kept. Level l has 1/8 of the voxels of level l-1 and twice its channels,
// so a level's segments hold about 4x those of the level below: levels go
// full resolution first. Within a level, the encoder segment holds a little
// more than the decoder's (the pooled input and the pool's int64 indices,
// and at level 0 the input projection), so "enc.l" comes before "dec.l".
// unet3d_test pins that the saving of each further segment does not grow.

// Note [U-Net checkpoints]
// What a checkpointed segment runs (UNet3d::run). A pooled encoder block is
// one checkpoint of its unpooled input (the pool's output and int64 indices
// are dropped). Any other block keeps its shortcut outside the checkpoint
// -- the projection saves only the block's inputs, kept anyway, and its
// output becomes the block's output in place -- and checkpoints its main
// path, norm2(conv2(relu(norm1(conv1(xs))))). The last block of the forward
// (the full-resolution decoder; enc.0 when depth is 1) checkpoints that path
// as two pieces, conv1 block and conv2 block: backward runs it first, its
// inner boundary lives only between its own forward and backward, and the
// training peak, which is in this block's backward, then holds one
// convolution block's recomputation at a time. Splitting other blocks would
// keep their boundaries alive through this block's backward and raise the
// peak. Measured with `bench_memory --models unet3d --amp off -w 1 -n 2`
// (64^3, feature_size 16, depth 3, instance norm, micro-batch 2, 1 rank):
// ARCHITECTURE.md Note [Segment granularity]. With offload (Note [Host
// offload]) the inputs are not kept anyway: in every block but the last
// the projection is a checkpoint of its own, so that no saved tensor
// holds the inputs and they leave the device (the projection, a 1x1x1
// convolution, is recomputed in backward; the graph keeps full
// checkpointing's shape, so the gradients are its bit for bit, in bf16
// too); the last block's inputs are the first needed in backward and
// stay.

// Note [U-Net block order]
// A block computes its shortcut (the 1x1x1 projection, or the input) before
// its main path. Backward runs nodes newest first, so the projection's
// backward comes last: until then only the gradient at the sum is held for
// it, instead of the two input-sized gradients (upsampled, skip) it would
// have produced first and held through the whole main path's backward.
// relu(h + s) runs in place on the projection's output (nothing saved it).
// Without checkpointing this alone lowered the 64^3 peak from 550,550,528 B
// to 521,143,296 B.

// Note [U-Net decoder input]
// A decoder block's input is [upsampled, skip] along channels. Its conv1
// and projection run on the two parts with their slices of the weights
// and add up (ResBlockImpl::halves): the same sums as on the
// concatenation, without making it. The skip is the encoder's output,
// kept anyway (the next level's input, the checkpoint's saved input), so
// a concatenation was a second copy of it at full resolution, and the
// convolutions' backward held the gradient and transients of both parts
// at once. Measured (bench_memory as above): peak 626.0 MB -> 550.6 MB
// without checkpointing, 520.1 MB -> 444.6 MB with every block
// checkpointed. The parameters keep their names and shapes
// (dec.l.conv1.weight is [f, 2f, 3, 3, 3]). The split costs time in
// backward where the halves are narrow: oneDNN's convolution backward at 8
// input channels (feature size 8, 32^3, batch 2, 1 thread; timed with
// torch.nn.functional.conv3d of Debian's python3-torch 1.13, the same
// kernels) took 14.5 ms per half against 10.8 ms for the whole, the
// level-0 block 37-40 ms against 22-26 ms forward and backward. So a training
// run without memory.budget (nothing asks for the memory) gives the block the
// concatenation (set_memory_lean(false)), and so does a run whose budget
// fits it at the planned micro-batch and tier (Note [Planning the faster
// form]); otherwise, and without gradients (validation, inference:
// forward only, where the split is also the faster, 4.9 vs 8.8 ms), the
// split.

}  // namespace

int64_t unet3d_divisor(int64_t depth) {
  MT_CHECK(
      depth >= 1 && depth <= 16,
      "model.depth=",
      depth,
      ": unet3d needs 1..16 levels");
  return int64_t{1} << (depth - 1);
}

std::shared_ptr<Classifier> make_unet3d(
    const ModelConfig& cfg, int64_t in_channels, int64_t num_classes) {
  MT_CHECK(
      cfg.depth >= 1,
      "model.depth=",
      cfg.depth,
      ": unet3d needs at least 1 level");
  MT_CHECK(
      model_feature_size(cfg) >= 1,
      "model.feature_size=",
      model_feature_size(cfg),
      ": must be at least 1");
  MT_CHECK(
      in_channels >= 1 && num_classes >= 1,
      "unet3d: needs at least one input channel and one class, got ",
      in_channels,
      " channel(s) and ",
      num_classes,
      " class(es)");
  return std::make_shared<UNet3d>(cfg, in_channels, num_classes);
}

}  // namespace memtrain
