#include "memtrain/model/blocks/checkpointed.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "memtrain/compat.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/memory/host_pool.h"
#include "memtrain/model/blocks/blocked_attention.h"
#include "memtrain/model/blocks/fused_attention.h"
#include "memtrain/util/error.h"

namespace memtrain {

// Note [Checkpointing]
// checkpoint() runs the segment with grad mode off, so no graph and no
// activations are kept, and hangs the output on a node of its own
// (CheckpointBackward) that saves the inputs, the CPU RNG state and the
// autocast state. Its backward restores both, re-runs the segment with grad
// mode on from detached copies of the inputs, back-propagates the incoming
// gradient through that recomputation (a reentrant backward: parameter
// gradients accumulate into .grad as usual), and returns the inputs'
// gradients. The RNG is forked: its state after backward is what it was
// before, so recomputation does not shift the random stream of the rest of
// training. Both the CPU generator and, for an input on a GPU, that device's
// generator are saved and replayed. With Recompute::kAllOffload the node
// keeps no input: the host pool holds them between the forward and the
// backward (Note [Host offload] in memory/host_pool.cpp).
//
// Note [Checkpoint gradient lifetime]
// The node is a torch::autograd::Node of its own rather than a
// torch::autograd::Function: a Function's backward receives a copy of the
// incoming gradient while the engine and the wrapper keep theirs until it
// returns, so a full activation-sized gradient stayed alive through the
// whole recomputation and inner backward of every segment. Here apply()
// takes the engine's gradient by move; the inner backward starts from the
// recomputed output's edge with the output itself dropped, and a pre-hook on
// that first node lets go of the last reference held here. The incoming
// gradient and the recomputed output are then freed as soon as the first
// inner node has used them (measured: bench_memory's unet3d, see
// ARCHITECTURE.md).

// Note [Selective recompute]
// Full checkpointing recomputes a whole segment in backward, its
// convolutions included. A selective checkpoint (Recompute::kSelective)
// also keeps, through the forward, the outputs of the segment's kept_conv()
// calls -- what the model marks as its expensive operations -- and its
// recomputation hands them back instead of convolving again: backward
// recomputes only what lies between them (normalisation, activations,
// additions, pooling, the SE gate). bench_memory, SE-ResNeXt50 at 224²:
// 1.09x the time of no checkpointing and 0.73x its peak, against 1.35x and
// 0.46x for full checkpointing (ARCHITECTURE.md). What stays alive between a
// selective segment's forward and its backward: its inputs and its
// convolutions' outputs; without checkpointing, also every normalised and
// activated tensor the graph saves.
//
// How: the forward runs the segment with grad mode off, as always, with a
// thread-local scope whose `sink` collects each kept_conv() output (and
// kept_linear()'s, Note [Kept matrix products]) in call order. The
// recomputation runs it with grad mode on and a scope whose `source` gives them
// back in the same order; each handed-back output gets a KeptConvBackward node,
// which is ConvolutionBackward's arithmetic (at::convolution_backward of the
// same input, weight and arguments, the input being the recomputed one, bitwise
// what the forward had), so the gradients are those of no checkpointing bit for
// bit in fp32 (tests). Under autocast the node's input and weight are cast to
// the kept output's dtype, as autocast casts a convolution's. A checkpoint
// opened inside a segment (none of memtrain's models nests them) takes the
// outer scope's source for its own forward, so the outer stream stays in step.
// A kept output that the segment changed in place would come back changed: the
// version counter is checked, and the U-Net's join adds out of place while
// keeping_outputs(). A sum of convolutions (kept_conv_sum: the U-Net
// decoder's conv1 on its two input parts) is kept as one output, whose
// node runs each term's convolution backward from the same gradient, as
// the in-place additions' backward hands it to each.
//
// Note [Kept matrix products]
// A transformer's cost is its matrix products: attention's q/k/v and
// output projections and the MLP's two linears. kept_linear() keeps their
// outputs as kept_conv() keeps a convolution's, so a selective segment of
// a transformer block recomputes only its layer norms, activations,
// residual additions and the attention between the projections. Bit for
// bit needs the backward of the very ops the forward ran, and
// torch::linear picks its ops by version and input (addmm, or matmul and
// an in-place add, on LibTorch 1.13 for inputs other than 2-D and
// contiguous 3-D), so kept_linear always runs one form, checkpointed or
// not: the input flattened to rows, at::addmm(b, rows, W^T) (at::mm
// without a bias), the rows viewed back to the input's leading axes. Its
// KeptLinearBackward runs the formulas PyTorch's derivatives.yaml gives
// addmm (mm_mat1_backward, mm_mat2_backward, then W^T's transpose; the
// bias's gradient summed over the rows, as the engine sums a broadcast
// input's) with the same operands in the same layouts, so the same
// kernels run on the same memory: the tests check the gradients bit for
// bit against no checkpointing, on LibTorch 1.13 and 2.11.

namespace {

// The kept outputs of one selective checkpoint, in call order (kept_conv()
// and kept_linear() calls).
struct KeptOutputs {
  struct Kept {
    at::Tensor t;  // detached: no autograd metadata, so no reference cycle
    // What else its backward needs: attention's log-sum-exp (and a fused
    // kernel's RNG state, Note [Kept fused attention]).
    std::vector<at::Tensor> aux;
    int64_t version = 0;
    // The call that made it (its kind, operand sizes and arguments),
    // compared when it is handed back.
    std::vector<int64_t> call;
    int64_t backend = 0;  // a fused attention's kernel (FusedAttentionForward)
  };
  std::vector<Kept> outs;
  size_t next = 0;
};

// The kept_conv() scope of this thread (Note [Selective recompute]).
struct KeepScope {
  KeptOutputs* source = nullptr;  // hand back these (a recomputation)
  KeptOutputs* sink = nullptr;    // keep the outputs here (a forward)
};
thread_local KeepScope t_keep;

struct KeepScopeGuard {
  explicit KeepScopeGuard(KeepScope scope) : saved(t_keep) {
    t_keep = scope;
  }
  ~KeepScopeGuard() {
    t_keep = saved;
  }
  KeepScopeGuard(const KeepScopeGuard&) = delete;
  KeepScopeGuard& operator=(const KeepScopeGuard&) = delete;
  KeepScope saved;
};

// ConvolutionBackward of a kept convolution output, or of a kept sum of
// convolutions (kept_conv_sum): each term's own, from the same gradient.
struct KeptConvBackward : torch::autograd::Node {
  struct Term {
    torch::autograd::SavedVariable input, weight;
    bool has_bias = false;
    std::vector<int64_t> bias_sizes;
  };
  std::vector<Term> terms;  // edges 3k, 3k+1, 3k+2: input, weight, bias
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups = 1;

  std::string name() const override {
    return "memtrain::KeptConvBackward";
  }

  void release_variables() override {
    for (Term& t : terms) {
      t.input.reset_data();
      t.weight.reset_data();
    }
  }

  torch::autograd::variable_list apply(
      torch::autograd::variable_list&& grads) override {
    torch::autograd::variable_list out(3 * terms.size());
    if (grads.empty() || !grads[0].defined())
      return out;
    const std::vector<int64_t> output_padding(stride.size(), 0);
    for (size_t k = 0; k < terms.size(); ++k) {
      Term& t = terms[k];
      const std::array<bool, 3> mask = {
          should_compute_output(3 * k),
          should_compute_output(3 * k + 1),
          t.has_bias && should_compute_output(3 * k + 2)};
      const at::Tensor x = t.input.unpack(), w = t.weight.unpack();
      t.input.reset_data();
      t.weight.reset_data();
      auto r = at::convolution_backward(
          grads[0],
          x,
          w,
          t.has_bias ? c10::OptionalIntArrayRef(t.bias_sizes)
                     : c10::OptionalIntArrayRef(),
          stride,
          padding,
          dilation,
          /*transposed=*/false,
          output_padding,
          groups,
          mask);
      out[3 * k] = std::move(std::get<0>(r));
      out[3 * k + 1] = std::move(std::get<1>(r));
      out[3 * k + 2] = std::move(std::get<2>(r));
    }
    return out;
  }
};

// A convolution's arguments besides its tensors (kept_conv's).
struct ConvArgs {
  c10::IntArrayRef stride, padding, dilation;
  int64_t groups;
};

at::Tensor convolve(const ConvTerm& t, const ConvArgs& a) {
  switch (t.weight.dim()) {
    case 3:
      return torch::conv1d(
          t.x, t.weight, t.bias, a.stride, a.padding, a.dilation, a.groups);
    case 4:
      return torch::conv2d(
          t.x, t.weight, t.bias, a.stride, a.padding, a.dilation, a.groups);
    case 5:
      return torch::conv3d(
          t.x, t.weight, t.bias, a.stride, a.padding, a.dilation, a.groups);
    default:
      break;
  }
  MT_INTERNAL_ASSERT(
      false, "kept_conv: a weight of ", t.weight.dim(), " dimensions");
  return {};
}

// Whether any of `ts` (undefined ones aside) requires a gradient.
bool any_requires_grad(std::initializer_list<at::Tensor> ts) {
  return std::any_of(ts.begin(), ts.end(), [](const at::Tensor& t) {
    return t.defined() && t.requires_grad();
  });
}

// An operand of a kept op in its kept output's dtype, as autocast cast it
// (undefined stays undefined).
at::Tensor cast_like(const at::Tensor& t, const at::Tensor& kept) {
  const auto dtype = kept.scalar_type();
  return !t.defined() || t.scalar_type() == dtype ? t : t.to(dtype);
}

// What identifies a kept call, for the kept outputs' check: its kind, then
// its operands' sizes and arguments.
constexpr int64_t kConvCall = -1, kLinearCall = -2, kAttentionCall = -3;
// An attention call's last entry: blocked (kept_attention's own) or fused
// (LibTorch's kernel, Note [Kept fused attention]).
constexpr int64_t kBlockedAttention = 0, kFusedAttention = 1;

// A convolution sum's.
std::vector<int64_t> conv_call(
    const std::vector<ConvTerm>& terms, const ConvArgs& a) {
  std::vector<int64_t> call{kConvCall};
  for (const ConvTerm& t : terms) {
    call.insert(call.end(), t.x.sizes().begin(), t.x.sizes().end());
    call.insert(call.end(), t.weight.sizes().begin(), t.weight.sizes().end());
  }
  for (c10::IntArrayRef v : {a.stride, a.padding, a.dilation})
    call.insert(call.end(), v.begin(), v.end());
  call.push_back(a.groups);
  return call;
}

// A kept output handed back in a recomputation: a new tensor of the same
// storage whose gradient goes through the convolutions' own backward.
at::Tensor with_conv_history(
    const at::Tensor& kept,
    const std::vector<ConvTerm>& terms,
    const ConvArgs& a) {
  at::Tensor out = kept.detach();
  bool any = false;
  for (const ConvTerm& t : terms)
    any = any || any_requires_grad({t.x, t.weight, t.bias});
  if (!torch::GradMode::is_enabled() || !any)
    return out;
  // Autocast casts a convolution's input and weight to its output's dtype.
  const auto cast = [&kept](const at::Tensor& t) { return cast_like(t, kept); };
  auto node = std::shared_ptr<KeptConvBackward>(
      new KeptConvBackward(), torch::autograd::deleteNode);
  torch::autograd::edge_list edges;
  for (const ConvTerm& t : terms) {
    const at::Tensor xi = cast(t.x), wi = cast(t.weight), bi = cast(t.bias);
    KeptConvBackward::Term term;
    term.input = torch::autograd::SavedVariable(xi, /*is_output=*/false);
    term.weight = torch::autograd::SavedVariable(wi, /*is_output=*/false);
    term.has_bias = bi.defined();
    if (bi.defined())
      term.bias_sizes = bi.sizes().vec();
    node->terms.push_back(std::move(term));
    for (auto& e : torch::autograd::collect_next_edges(xi, wi, bi))
      edges.push_back(std::move(e));
  }
  node->stride = a.stride.vec();
  node->padding = a.padding.vec();
  node->dilation = a.dilation.vec();
  node->groups = a.groups;
  node->set_next_edges(std::move(edges));
  torch::autograd::set_history(out, node);
  return out;
}

// A linear map's: its rows, weight and whether it has a bias.
std::vector<int64_t> linear_call(
    const at::Tensor& rows, const at::Tensor& weight, const at::Tensor& bias) {
  std::vector<int64_t> call{kLinearCall};
  call.insert(call.end(), rows.sizes().begin(), rows.sizes().end());
  call.insert(call.end(), weight.sizes().begin(), weight.sizes().end());
  call.push_back(bias.defined());
  return call;
}

// An attention's: its operands' sizes (-1 for no bias), causality and
// kind (kBlockedAttention or kFusedAttention).
std::vector<int64_t> attention_call(
    std::initializer_list<at::Tensor> operands,
    bool causal,
    int64_t kind = kBlockedAttention) {
  std::vector<int64_t> call{kAttentionCall};
  for (const at::Tensor& t : operands) {
    if (t.defined())
      call.insert(call.end(), t.sizes().begin(), t.sizes().end());
    call.push_back(t.defined() ? t.dim() : -1);
  }
  call.push_back(causal);
  call.push_back(kind);
  return call;
}

// A kept linear map's: addmm's (or mm's) backward of rows x W^T (+ b), the
// rows and W as the forward had them (Note [Kept matrix products]).
struct KeptLinearBackward : torch::autograd::Node {
  torch::autograd::SavedVariable rows, weight;  // edges 0, 1; the bias 2
  std::vector<int64_t> rows_sizes, rows_strides;
  bool has_bias = false;
  std::vector<int64_t> bias_sizes;

  std::string name() const override {
    return "memtrain::KeptLinearBackward";
  }

  void release_variables() override {
    rows.reset_data();
    weight.reset_data();
  }

  torch::autograd::variable_list apply(
      torch::autograd::variable_list&& grads) override {
    torch::autograd::variable_list out(3);
    if (grads.empty() || !grads[0].defined())
      return out;
    const at::Tensor& g = grads[0];
    const at::Tensor x = rows.unpack(), w = weight.unpack();
    const at::Tensor wt = w.t();  // addmm's mat2
    // mm_mat1_backward(g, mat2 = W^T, the rows' sizes and strides).
    if (should_compute_output(0)) {
      out[0] = rows_strides[0] == 1 && rows_strides[1] == rows_sizes[0]
                   ? wt.mm(g.t()).t()
                   : g.mm(wt.t());
    }
    // mm_mat2_backward(g, mat1 = rows, W^T's sizes and strides), then the
    // transpose's backward.
    if (should_compute_output(1)) {
      const at::Tensor gwt = wt.stride(0) == 1 && wt.stride(1) == wt.size(0)
                                 ? g.t().mm(x).t()
                                 : x.t().mm(g);
      out[1] = gwt.t();
    }
    if (has_bias && should_compute_output(2))
      out[2] = at::sum_to(g, bias_sizes);
    return out;
  }
};

// A kept linear output handed back in a recomputation: the kept rows with
// KeptLinearBackward's history.
at::Tensor with_linear_history(
    const at::Tensor& kept,
    const at::Tensor& rows,
    const at::Tensor& weight,
    const at::Tensor& bias) {
  at::Tensor out = kept.detach();
  if (!torch::GradMode::is_enabled() ||
      !any_requires_grad({rows, weight, bias}))
    return out;
  // Autocast casts addmm's operands to its output's dtype.
  const at::Tensor x = cast_like(rows, kept), w = cast_like(weight, kept),
                   b = cast_like(bias, kept);
  auto node = std::shared_ptr<KeptLinearBackward>(
      new KeptLinearBackward(), torch::autograd::deleteNode);
  node->rows = torch::autograd::SavedVariable(x, /*is_output=*/false);
  node->weight = torch::autograd::SavedVariable(w, /*is_output=*/false);
  node->rows_sizes = x.sizes().vec();
  node->rows_strides = x.strides().vec();
  node->has_bias = b.defined();
  if (b.defined())
    node->bias_sizes = b.sizes().vec();
  node->set_next_edges(torch::autograd::collect_next_edges(x, w, b));
  torch::autograd::set_history(out, node);
  return out;
}

// Clears `held` when the node it is attached to starts: the engine has its
// own copy of the gradient by then.
struct ReleaseOnStart : torch::autograd::FunctionPreHook {
  explicit ReleaseOnStart(torch::autograd::variable_list* held) : held(held) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& grads) override {
    held->clear();
    return grads;
  }
  torch::autograd::variable_list* held;
};

struct CheckpointBackward : torch::autograd::Node {
  SegmentN fn;
  std::unique_ptr<KeptOutputs> kept;  // a selective checkpoint's
  std::vector<torch::autograd::SavedVariable> saved;
  std::shared_ptr<memory::OffloadGroup> offloaded;  // instead of `saved`
  std::vector<bool> needs;                          // which inputs require grad
  torch::Tensor rng, device_rng;
  compat::AutocastState amp;

  std::string name() const override {
    return "memtrain::CheckpointBackward";
  }

  void release_variables() override {
    saved.clear();
    offloaded.reset();
    kept.reset();
    fn = nullptr;
  }

  torch::autograd::variable_list apply(
      torch::autograd::variable_list&& grads) override {
    // With offload: this segment's inputs back now, and the next
    // segment's (in backward order) once this one is done (Note [Host
    // offload]: one segment ahead).
    const std::shared_ptr<memory::OffloadGroup> group = std::move(offloaded);
    torch::autograd::variable_list out =
        recompute_and_backward(std::move(grads), group.get());
    if (group)
      group->prefetch_ahead();
    return out;
  }

 private:
  torch::autograd::variable_list recompute_and_backward(
      torch::autograd::variable_list&& grads, memory::OffloadGroup* group) {
    torch::autograd::variable_list incoming = std::move(grads);
    MT_CHECK(
        !saved.empty() || group,
        "checkpoint: backward through a checkpointed segment a second time "
        "(its inputs were freed after the first); backward(retain_graph) is "
        "not supported with training.gradient_checkpointing");
    std::vector<torch::Tensor> xs;
    if (group) {
      xs = group->take();
      for (size_t i = 0; i < xs.size(); ++i)
        xs[i].requires_grad_(needs[i]);
    }
    for (size_t i = 0; i < saved.size(); ++i) {
      xs.push_back(saved[i]
                       .unpack(shared_from_this())
                       .detach()
                       .requires_grad_(needs[i]));
    }
    saved.clear();
    torch::autograd::variable_list none(xs.size());
    if (incoming.empty() || !incoming[0].defined()) {
      kept.reset();
      return none;  // the output was not used: no gradient to anything
    }

    // The generators: the CPU's, and the input device's when it has one.
    at::Generator gen = at::detail::getDefaultCPUGenerator();  // a handle
    std::optional<at::Generator> dev;
    if (device_rng.defined())
      dev = at::globalContext().defaultGenerator(xs[0].device());
    torch::Tensor rng_now, device_now;
    {
      memory::HostScope host;
      rng_now = gen.get_state();
      if (dev)
        device_now = dev->get_state();
    }
    // The generators go back to their states now however the recompute
    // ends.
    struct RestoreRng {
      at::Generator& gen;
      const torch::Tensor& state;
      std::optional<at::Generator>& dev;
      const torch::Tensor& dev_state;
      ~RestoreRng() {
        gen.set_state(state);
        if (dev)
          dev->set_state(dev_state);
      }
    };
    torch::Tensor y;
    {
      RestoreRng restore{gen, rng_now, dev, device_now};
      gen.set_state(rng);
      if (dev)
        dev->set_state(device_rng);
      compat::AutocastStateGuard replay(amp);
      torch::AutoGradMode grad(true);
      KeepScopeGuard keep({kept.get(), nullptr});
      y = fn(xs);
      MT_INTERNAL_ASSERT(
          !kept || kept->next == kept->outs.size(),
          "selective checkpoint: the recomputation used ",
          kept ? kept->next : 0,
          " of the forward's ",
          kept ? kept->outs.size() : 0,
          " kept outputs");
    }
    kept.reset();
    if (!y.requires_grad())
      return none;  // nothing inside needs a gradient (frozen, no grad input)
    // See Note [Checkpoint gradient lifetime].
    const torch::autograd::Edge root = torch::autograd::impl::gradient_edge(y);
    y.reset();
    root.function->add_pre_hook(std::make_unique<ReleaseOnStart>(&incoming));
    torch::autograd::Engine::get_default_engine().execute(
        {root},
        incoming,
        /*keep_graph=*/false,
        /*create_graph=*/false,
        /*accumulate_grad=*/true,
        /*outputs=*/{});
    torch::autograd::variable_list out;
    for (size_t i = 0; i < xs.size(); ++i)
      out.push_back(needs[i] ? xs[i].grad() : torch::Tensor());
    return out;
  }
};

}  // namespace

at::Tensor checkpoint(
    SegmentN segment, const std::vector<at::Tensor>& xs, Recompute mode) {
  MT_INTERNAL_ASSERT(!xs.empty(), "checkpoint of no input");
  // Without grad there is nothing to save or recompute (validation).
  if (!torch::GradMode::is_enabled())
    return segment(xs);
  auto node = std::shared_ptr<CheckpointBackward>(
      new CheckpointBackward(), torch::autograd::deleteNode);
  {
    memory::HostScope host;  // RNG state is bookkeeping, not activations
    node->rng = at::detail::getDefaultCPUGenerator().get_state();
    if (!xs[0].device().is_cpu())  // dropout on a GPU draws from its generator
      node->device_rng =
          at::globalContext().defaultGenerator(xs[0].device()).get_state();
  }
  node->amp = compat::autocast_state();
  if (mode == Recompute::kSelective)
    node->kept = std::make_unique<KeptOutputs>();
  if (mode == Recompute::kAllOffload) {
    // Before the segment runs, so that on CUDA the copies overlap it.
    const std::shared_ptr<memory::HostPool> pool = memory::offload_pool();
    MT_INTERNAL_ASSERT(
        pool, "checkpoint with offload, and no host pool (set_offload_pool)");
    node->offloaded = pool->offload(xs);
  }
  at::Tensor y;
  {
    torch::NoGradGuard no_grad;
    // Inside a recomputation, the outer checkpoint's kept outputs are
    // handed back here too (Note [Selective recompute]).
    KeepScopeGuard keep({t_keep.source, node->kept.get()});
    y = segment(xs);
  }
  // The output gets its history from the node; a segment that hands back an
  // input or a view of one gets a copy, so no input's history is touched.
  if (y.is_view() ||
      std::any_of(xs.begin(), xs.end(), [&y](const at::Tensor& x) {
        return y.is_same(x);
      }))
    y = y.clone();
  node->set_next_edges(torch::autograd::collect_next_edges(xs));
  for (const at::Tensor& x : xs) {
    node->needs.push_back(x.requires_grad());
    if (!node->offloaded)
      node->saved.emplace_back(x, /*is_output=*/false);
  }
  node->fn = std::move(segment);
  torch::autograd::set_history(y, node);
  return y;
}

at::Tensor checkpoint(Segment segment, const at::Tensor& x, Recompute mode) {
  return checkpoint(
      [fn = std::move(segment)](const std::vector<at::Tensor>& xs) {
        return fn(xs[0]);
      },
      std::vector<at::Tensor>{x},
      mode);
}

namespace {

// The next kept output of a recomputation's `source`, checked to be the
// one `call` made and unchanged since (Note [Selective recompute]).
KeptOutputs::Kept take_kept(
    KeptOutputs& src, const std::vector<int64_t>& call) {
  MT_INTERNAL_ASSERT(
      src.next < src.outs.size(),
      "selective checkpoint: the recomputation asks for kept output ",
      src.next + 1,
      " of ",
      src.outs.size());
  KeptOutputs::Kept k = std::move(src.outs[src.next++]);
  MT_INTERNAL_ASSERT(
      !k.t.defined() || k.t._version() == k.version,
      "selective checkpoint: a kept output was modified in place after it "
      "was kept");
  MT_INTERNAL_ASSERT(
      k.call == call,
      "selective checkpoint: kept output ",
      src.next,
      " of shape ",
      k.t.defined() ? k.t.sizes() : c10::IntArrayRef(),
      " was made by another call (",
      c10::IntArrayRef(k.call),
      ") than the one (",
      c10::IntArrayRef(call),
      ") that asks for it");
  return k;
}

void keep(
    KeptOutputs& sink,
    const at::Tensor& y,
    std::vector<int64_t> call,
    std::vector<at::Tensor> aux = {},
    int64_t backend = 0) {
  sink.outs.push_back(
      {y.defined() ? y.detach() : y,
       std::move(aux),
       y.defined() ? y._version() : 0,
       std::move(call),
       backend});
}

}  // namespace

at::Tensor kept_conv_sum(
    const std::vector<ConvTerm>& terms,
    c10::IntArrayRef stride,
    c10::IntArrayRef padding,
    c10::IntArrayRef dilation,
    int64_t groups) {
  MT_INTERNAL_ASSERT(!terms.empty(), "kept_conv_sum of no convolution");
  const KeepScope scope = t_keep;
  const ConvArgs args{stride, padding, dilation, groups};
  at::Tensor y;
  if (scope.source) {
    y = with_conv_history(
        take_kept(*scope.source, conv_call(terms, args)).t, terms, args);
  } else {
    y = convolve(terms[0], args);
    for (size_t i = 1; i < terms.size(); ++i)
      y.add_(convolve(terms[i], args));  // y is this call's own tensor
  }
  if (scope.sink)
    keep(*scope.sink, y, conv_call(terms, args));
  return y;
}

at::Tensor kept_linear(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  MT_INTERNAL_ASSERT(
      weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1),
      "kept_linear: an input of ",
      x.sizes(),
      " and a weight of ",
      weight.sizes());
  const KeepScope scope = t_keep;
  std::vector<int64_t> out_sizes = x.sizes().vec();
  out_sizes.back() = weight.size(0);
  const at::Tensor rows = x.reshape({-1, weight.size(1)});
  at::Tensor y;
  if (scope.source) {
    y = with_linear_history(
        take_kept(*scope.source, linear_call(rows, weight, bias)).t,
        rows,
        weight,
        bias);
  } else {
    y = bias.defined() ? at::addmm(bias, rows, weight.t())
                       : rows.mm(weight.t());
  }
  if (scope.sink)
    keep(*scope.sink, y, linear_call(rows, weight, bias));
  return y.view(out_sizes);
}

at::Tensor kept_conv(
    const at::Tensor& x,
    const at::Tensor& weight,
    const at::Tensor& bias,
    c10::IntArrayRef stride,
    c10::IntArrayRef padding,
    c10::IntArrayRef dilation,
    int64_t groups) {
  return kept_conv_sum({{x, weight, bias}}, stride, padding, dilation, groups);
}

at::Tensor kept_attention(
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    const at::Tensor& bias,
    double scale,
    bool causal) {
  const KeepScope scope = t_keep;
#if MEMTRAIN_TORCH_AT_LEAST(2, 1)
  // A GPU's fused kernels, or the CPU's flash kernel when there is no bias
  // (it takes no 3-D bias, nor one that requires a gradient: SwinUNETR's
  // would go to the written-out math, which keeps the scores). A selective
  // checkpoint keeps the fused kernel's output where its backward can run
  // from it (Note [Kept fused attention]), otherwise recomputes it.
  if (q.is_cuda() || !bias.defined()) {
    if (!scope.source && !scope.sink)
      return compat::attention(q, k, v, bias, scale, causal);
    // One record per call, kept or not (an undefined tensor: the kernel's
    // backward could not run from it, so it is recomputed), its dtype in
    // the call: a recomputation takes exactly what its forward kept.
    std::vector<int64_t> call =
        attention_call({q, k, v, bias}, causal, kFusedAttention);
    call.push_back(static_cast<int64_t>(q.scalar_type()));
    std::optional<FusedAttentionForward> fwd;
    if (scope.source) {
      KeptOutputs::Kept kept = take_kept(*scope.source, call);
      if (kept.t.defined())
        fwd = FusedAttentionForward{kept.backend, kept.t, std::move(kept.aux)};
    } else {
      fwd = fused_attention_forward(q, k, v, bias, scale, causal);
    }
    if (scope.sink) {
      if (fwd)
        keep(*scope.sink, fwd->out, call, fwd->aux, fwd->backend);
      else
        keep(*scope.sink, at::Tensor(), call);
    }
    return fwd ? fused_attention(q, k, v, scale, causal, std::move(*fwd))
               : compat::attention(q, k, v, bias, scale, causal);
  }
#endif
  if (!scope.source && !scope.sink)  // not in a selective checkpoint
    return blocked_attention(q, k, v, bias, scale, causal);
  AttentionRows fwd;
  if (scope.source) {
    KeptOutputs::Kept kept =
        take_kept(*scope.source, attention_call({q, k, v, bias}, causal));
    fwd = {kept.t, kept.aux.at(0)};
  } else {
    fwd = blocked_attention_forward(
        q, k, v, bias, scale, causal, attention_block_rows(q, k.size(-2)));
  }
  if (scope.sink) {
    keep(
        *scope.sink,
        fwd.out,
        attention_call({q, k, v, bias}, causal),
        {fwd.lse});
  }
  return blocked_attention(q, k, v, bias, scale, causal, fwd);
}

bool keeping_outputs() {
  return t_keep.source != nullptr || t_keep.sink != nullptr;
}

}  // namespace memtrain
