#include "memtrain/model/blocks/checkpointed.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "memtrain/compat.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/memory/host_pool.h"
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
// thread-local scope whose `sink` collects each kept_conv() output in call
// order. The recomputation runs it with grad mode on and a scope whose
// `source` gives them back in the same order; each handed-back output gets
// a KeptConvBackward node, which is ConvolutionBackward's arithmetic
// (at::convolution_backward of the same input, weight and arguments, the
// input being the recomputed one, bitwise what the forward had), so the
// gradients are those of no checkpointing bit for bit in fp32 (tests). Under
// autocast the node's input and weight are cast to the kept output's
// dtype, as autocast casts a convolution's. A checkpoint opened inside a
// segment (none of memtrain's models nests them) takes the outer scope's
// source for its own forward, so the outer stream stays in step. A kept output
// that the segment changed in place would come back changed: the version
// counter is checked, and the U-Net's join adds out of place while
// keeping_outputs(). A sum of convolutions (kept_conv_sum: the U-Net
// decoder's conv1 on its two input parts) is kept as one output, whose
// node runs each term's convolution backward from the same gradient, as
// the in-place additions' backward hands it to each.

namespace {

// The kept outputs of one selective checkpoint, in kept_conv() call order.
struct KeptOutputs {
  struct Kept {
    at::Tensor t;  // detached: no autograd metadata, so no reference cycle
    int64_t version = 0;
    // The convolution that made it: input and weight sizes, stride,
    // padding, dilation, groups, compared when it is handed back.
    std::vector<int64_t> call;
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

// What identifies a convolution sum's call, for the kept outputs' check.
std::vector<int64_t> conv_call(
    const std::vector<ConvTerm>& terms, const ConvArgs& a) {
  std::vector<int64_t> call;
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
  for (const ConvTerm& t : terms) {
    any = any || t.x.requires_grad() || t.weight.requires_grad() ||
          (t.bias.defined() && t.bias.requires_grad());
  }
  if (!torch::GradMode::is_enabled() || !any)
    return out;
  // Autocast casts a convolution's input and weight to its output's dtype.
  const auto dtype = kept.scalar_type();
  const auto cast = [dtype](const at::Tensor& t) {
    return !t.defined() || t.scalar_type() == dtype ? t : t.to(dtype);
  };
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
    KeptOutputs& src = *scope.source;
    MT_INTERNAL_ASSERT(
        src.next < src.outs.size(),
        "selective checkpoint: the recomputation asks for kept output ",
        src.next + 1,
        " of ",
        src.outs.size());
    KeptOutputs::Kept k = std::move(src.outs[src.next++]);
    MT_INTERNAL_ASSERT(
        k.t._version() == k.version,
        "selective checkpoint: a kept convolution output was modified in "
        "place after it was kept");
    MT_INTERNAL_ASSERT(
        k.call == conv_call(terms, args),
        "selective checkpoint: kept output ",
        src.next,
        " of shape ",
        k.t.sizes(),
        " was made by another convolution than the one of ",
        terms[0].x.sizes(),
        " by ",
        terms[0].weight.sizes(),
        " that asks for it");
    y = with_conv_history(k.t, terms, args);
  } else {
    y = convolve(terms[0], args);
    for (size_t i = 1; i < terms.size(); ++i)
      y.add_(convolve(terms[i], args));  // y is this call's own tensor
  }
  if (scope.sink) {
    scope.sink->outs.push_back(
        {y.detach(), y._version(), conv_call(terms, args)});
  }
  return y;
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

bool keeping_outputs() {
  return t_keep.source != nullptr || t_keep.sink != nullptr;
}

}  // namespace memtrain
