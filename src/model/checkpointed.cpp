#include "memtrain/model/checkpointed.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/torch.h>

#include <optional>

#include "memtrain/compat.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/util/error.h"

namespace memtrain {

// Note [Checkpointing]
// forward() runs the segment with grad mode off (Function::apply does that),
// so no graph and no activations are kept; it saves the input, the CPU RNG
// state and the autocast state. backward() restores both, re-runs the
// segment with grad mode on from a detached copy of the input, back-
// propagates the incoming gradient through that recomputation (a reentrant
// backward: parameter gradients accumulate into .grad as usual), and returns
// the input's gradient. The RNG is forked: its state after backward is what
// it was before, so recomputation does not shift the random stream of the
// rest of training. Both the CPU generator and, for an input on a GPU, that
// device's generator are saved and replayed.

namespace {

struct SegmentHolder : torch::CustomClassHolder {
  SegmentN fn;
};

struct CheckpointFunction
    : public torch::autograd::Function<CheckpointFunction> {
  static torch::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      at::TensorList xs,
      c10::intrusive_ptr<SegmentHolder> holder) {
    const at::Tensor& x = xs[0];
    torch::Tensor rng, device_rng;
    {
      memory::HostScope host;  // RNG state is bookkeeping, not activations
      rng = at::detail::getDefaultCPUGenerator().get_state();
      if (!x.device().is_cpu())  // dropout on a GPU draws from its generator
        device_rng =
            at::globalContext().defaultGenerator(x.device()).get_state();
    }
    const compat::AutocastState amp = compat::autocast_state();
    ctx->saved_data["fn"] = c10::IValue::make_capsule(holder);
    ctx->saved_data["rng"] = rng;
    ctx->saved_data["has_device_rng"] = device_rng.defined();
    if (device_rng.defined())
      ctx->saved_data["device_rng"] = device_rng;
    ctx->saved_data["cpu_amp"] = amp.cpu_enabled;
    ctx->saved_data["cpu_amp_dtype"] = static_cast<int64_t>(amp.cpu_dtype);
    ctx->saved_data["cuda_amp"] = amp.cuda_enabled;
    ctx->saved_data["cuda_amp_dtype"] = static_cast<int64_t>(amp.cuda_dtype);
    c10::List<bool> needs;
    for (const at::Tensor& t : xs)
      needs.push_back(t.requires_grad());
    ctx->saved_data["x_requires_grad"] = needs;
    ctx->save_for_backward(xs.vec());
    return holder->fn(xs.vec());
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grad_out) {
    auto holder = c10::static_intrusive_pointer_cast<SegmentHolder>(
        ctx->saved_data["fn"].toCapsule());
    const c10::List<bool> needs =
        ctx->saved_data["x_requires_grad"].toBoolList();
    std::vector<torch::Tensor> xs = ctx->get_saved_variables();
    for (size_t i = 0; i < xs.size(); ++i)
      xs[i] = xs[i].detach().requires_grad_(needs[i]);
    const torch::Tensor& x = xs[0];

    compat::AutocastState amp;
    amp.cpu_enabled = ctx->saved_data["cpu_amp"].toBool();
    amp.cpu_dtype =
        static_cast<c10::ScalarType>(ctx->saved_data["cpu_amp_dtype"].toInt());
    amp.cuda_enabled = ctx->saved_data["cuda_amp"].toBool();
    amp.cuda_dtype =
        static_cast<c10::ScalarType>(ctx->saved_data["cuda_amp_dtype"].toInt());

    // The generators: the CPU's, and the input device's when it has one.
    at::Generator gen = at::detail::getDefaultCPUGenerator();  // a handle
    at::Tensor saved_device;
    std::optional<at::Generator> dev;
    if (ctx->saved_data["has_device_rng"].toBool()) {
      saved_device = ctx->saved_data["device_rng"].toTensor();
      dev = at::globalContext().defaultGenerator(x.device());
    }
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
      gen.set_state(ctx->saved_data["rng"].toTensor());
      if (dev)
        dev->set_state(saved_device);
      compat::AutocastStateGuard replay(amp);
      torch::AutoGradMode grad(true);
      y = holder->fn(xs);
    }
    torch::autograd::backward({y}, {grad_out[0]});
    torch::autograd::variable_list grads;
    for (size_t i = 0; i < xs.size(); ++i)
      grads.push_back(needs[i] ? xs[i].grad() : torch::Tensor());
    grads.emplace_back();  // the segment
    return grads;
  }
};

}  // namespace

at::Tensor checkpoint(SegmentN segment, const std::vector<at::Tensor>& xs) {
  MT_INTERNAL_ASSERT(!xs.empty(), "checkpoint of no input");
  // Without grad there is nothing to save or recompute (validation).
  if (!torch::GradMode::is_enabled())
    return segment(xs);
  auto holder = c10::make_intrusive<SegmentHolder>();
  holder->fn = std::move(segment);
  // The function's output needs grad only if an input does: when none does
  // (raw data), the segment's parameters would get no gradients, so the
  // first input becomes a detached copy that does.
  std::vector<at::Tensor> inputs = xs;
  bool any = false;
  for (const at::Tensor& t : xs)
    any = any || t.requires_grad();
  if (!any)
    inputs[0] = xs[0].detach().requires_grad_();
  return CheckpointFunction::apply(at::TensorList(inputs), holder);
}

at::Tensor checkpoint(Segment segment, const at::Tensor& x) {
  return checkpoint(
      [fn = std::move(segment)](const std::vector<at::Tensor>& xs) {
        return fn(xs[0]);
      },
      std::vector<at::Tensor>{x});
}

}  // namespace memtrain
