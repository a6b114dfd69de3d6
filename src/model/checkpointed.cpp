#include "memtrain/model/checkpointed.h"

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
// generator are saved and replayed.
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

namespace {

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
  std::vector<torch::autograd::SavedVariable> saved;
  std::vector<bool> needs;  // which inputs require grad
  torch::Tensor rng, device_rng;
  compat::AutocastState amp;

  std::string name() const override {
    return "memtrain::CheckpointBackward";
  }

  void release_variables() override {
    saved.clear();
    fn = nullptr;
  }

  torch::autograd::variable_list apply(
      torch::autograd::variable_list&& grads) override {
    torch::autograd::variable_list incoming = std::move(grads);
    MT_CHECK(
        !saved.empty(),
        "checkpoint: backward through a checkpointed segment a second time "
        "(its inputs were freed after the first); backward(retain_graph) is "
        "not supported with training.gradient_checkpointing");
    std::vector<torch::Tensor> xs;
    for (size_t i = 0; i < saved.size(); ++i) {
      xs.push_back(saved[i]
                       .unpack(shared_from_this())
                       .detach()
                       .requires_grad_(needs[i]));
    }
    saved.clear();
    torch::autograd::variable_list none(xs.size());
    if (incoming.empty() || !incoming[0].defined())
      return none;  // the output was not used: no gradient to anything

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
      y = fn(xs);
    }
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

at::Tensor checkpoint(SegmentN segment, const std::vector<at::Tensor>& xs) {
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
  at::Tensor y;
  {
    torch::NoGradGuard no_grad;
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
    node->saved.emplace_back(x, /*is_output=*/false);
  }
  node->fn = std::move(segment);
  torch::autograd::set_history(y, node);
  return y;
}

at::Tensor checkpoint(Segment segment, const at::Tensor& x) {
  return checkpoint(
      [fn = std::move(segment)](const std::vector<at::Tensor>& xs) {
        return fn(xs[0]);
      },
      std::vector<at::Tensor>{x});
}

}  // namespace memtrain
