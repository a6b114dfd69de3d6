#include "memtrain/train/state/optimizers.h"

#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>

#include "memtrain/compat.h"
#include "memtrain/util/error.h"

namespace memtrain {

// Note [Multi-tensor optimizers]
// LibTorch's C++ SGD and AdamW loop over parameters, several operations
// for each (timm's seresnext50_32x4d has 225 parameter tensors).
// These step a whole parameter group at once: _foreach_* operations
// (LibTorch >= 1.13), or, for CUDA parameters where LibTorch has them
// (>= 2.4), the fused kernels that PyTorch's `fused=True` runs. Neither
// has run on a GPU yet.
// Their arithmetic is LibTorch's per-parameter step's, term for term (SGD:
// d = g + wd p; b = m b + (1 - dampening) d, b = d at the first step;
// d = d + m b (Nesterov) or b; p -= lr d. AdamW: p *= 1 - lr wd;
// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; p -= lr / (1 - b1^t) m /
// (sqrt(v) / sqrt(1 - b2^t) + eps)), so they agree with it to float32
// rounding (tests/unit/train/optimizers_test.cpp; the foreach step on the
// CPU is bit-identical). The foreach step keeps its intermediates in the
// gradients, which the window drops after the step: it needs no memory
// beyond LibTorch's (whose per-parameter step makes one parameter's worth of
// temporaries at a time); the gradients hold garbage afterwards. The state is
// LibTorch's own objects under LibTorch's own keys, so save() and load() are
// LibTorch's and a checkpoint written with the per-parameter optimizers resumes
// with these, and back.

namespace {

namespace optim = torch::optim;

// The state map's key of p: LibTorch 1.13 keys by the TensorImpl's address
// as text, 2.x by the address itself.
template <class Map>
typename Map::key_type key_of(const Map&, const at::Tensor& p) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream s;
    s << p.unsafeGetTensorImpl();
    return s.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

template <class State>
State* state_of(optim::Optimizer& o, const at::Tensor& p) {
  auto& map = o.state();
  const auto it = map.find(key_of(map, p));
  return it == map.end() ? nullptr : static_cast<State*>(it->second.get());
}

template <class State>
State& add_state(optim::Optimizer& o, const at::Tensor& p) {
  auto& map = o.state();
  auto s = std::make_unique<State>();
  State& ref = *s;
  map[key_of(map, p)] = std::move(s);
  return ref;
}

at::Tensor run_closure(optim::Optimizer::LossClosure& closure) {
  if (!closure)
    return {};
  torch::AutoGradMode enable(true);
  return closure();
}

}  // namespace

bool have_fused_kernels() {
  return MEMTRAIN_HAVE_FUSED_OPTIMIZERS != 0;
}

StepKernel step_kernel_for(const c10::Device& device) {
  return have_fused_kernels() && device.is_cuda() ? StepKernel::kFused
                                                  : StepKernel::kForeach;
}

namespace {

// What LibTorch's options allow and these steps do not do.
void check_options(const optim::SGDOptions&) {}
void check_options(const optim::AdamWOptions& o) {
  MT_CHECK(
      !o.amsgrad(),
      "AdamW: amsgrad is not stepped here; use torch::optim::AdamW");
}

}  // namespace

template <class Base, class Options>
MultiTensor<Base, Options>::MultiTensor(
    const std::vector<at::Tensor>& params,
    const Options& options,
    StepKernel kernel)
    : Base(params, options), kernel_(kernel) {
  MT_CHECK(
      kernel != StepKernel::kFused || have_fused_kernels(),
      "the fused kernels need LibTorch >= 2.4 (the CUDA build's)");
  check_options(options);
}

template <class Base, class Options>
at::Tensor MultiTensor<Base, Options>::step(
    typename Base::LossClosure closure) {
  const at::Tensor loss = run_closure(closure);
  torch::NoGradGuard no_grad;
  for (auto& group : this->param_groups()) {
    std::vector<at::Tensor> params, grads;
    for (auto& p : group.params()) {
      if (!p.grad().defined())
        continue;
      MT_INTERNAL_ASSERT(!p.grad().is_sparse(), "sparse gradients");
      params.push_back(p);
      grads.push_back(p.grad());
    }
    if (!params.empty())
      step_group(static_cast<const Options&>(group.options()), params, grads);
  }
  return loss;
}

// State tensor `s` in its parameter's memory layout. LibTorch's archive
// keeps strides, so a checkpoint written in another layout (before
// model.channels_last, or where auto resolved otherwise) resumes into p's
// here, once; the fused kernels take one layout for all their tensors.
at::Tensor in_layout_of(const at::Tensor& s, const at::Tensor& p) {
  if (!s.defined() || s.strides() == p.strides())
    return s;
  return at::empty_like(p).copy_(s);  // p's layout (Preserve)
}

template <>
void MultiTensorSGD::step_group(
    const optim::SGDOptions& o,
    std::vector<at::Tensor>& params,
    std::vector<at::Tensor>& grads) {
  // The momentum buffers; `first`: no parameter had one yet.
  std::vector<at::Tensor> bufs;
  size_t have = 0;
  if (o.momentum() != 0) {
    for (const auto& p : params) {
      auto* st = state_of<optim::SGDParamState>(*this, p);
      have += st ? 1 : 0;
      if (st)
        st->momentum_buffer(in_layout_of(st->momentum_buffer(), p));
      bufs.push_back(st ? st->momentum_buffer() : at::Tensor());
    }
    MT_CHECK(
        have == 0 || have == params.size(),
        "SGD: ",
        have,
        " of ",
        params.size(),
        " parameters of a group have a momentum buffer; a group steps "
        "together (a checkpoint of another model?)");
  }
  const bool first = o.momentum() != 0 && have == 0;
#if MEMTRAIN_HAVE_FUSED_OPTIMIZERS
  if (kernel_ == StepKernel::kFused) {
    if (o.momentum() != 0 && first) {
      for (size_t i = 0; i < params.size(); ++i) {
        bufs[i] = at::empty_like(grads[i]);
        add_state<optim::SGDParamState>(*this, params[i])
            .momentum_buffer(bufs[i]);
      }
    }
    at::_fused_sgd_(
        params,
        grads,
        bufs,
        o.weight_decay(),
        o.momentum(),
        o.lr(),
        o.dampening(),
        o.nesterov(),
        /*maximize=*/false,
        /*is_first_step=*/first);
    return;
  }
#endif
  // d lives in the gradients (spent after the step): no temporaries.
  std::vector<at::Tensor>& d = grads;
  if (o.weight_decay() != 0)
    at::_foreach_add_(d, params, o.weight_decay());
  if (o.momentum() != 0) {
    if (first) {
      for (size_t i = 0; i < params.size(); ++i) {
        bufs[i] = d[i].clone().detach();
        add_state<optim::SGDParamState>(*this, params[i])
            .momentum_buffer(bufs[i]);
      }
    } else {
      at::_foreach_mul_(bufs, o.momentum());
      at::_foreach_add_(bufs, d, 1 - o.dampening());
    }
    if (o.nesterov()) {
      at::_foreach_add_(d, bufs, o.momentum());
    } else {
      d = bufs;
    }
  }
  at::_foreach_add_(params, d, -o.lr());
}

template <>
void MultiTensorAdamW::step_group(
    const optim::AdamWOptions& o,
    std::vector<at::Tensor>& params,
    std::vector<at::Tensor>& grads) {
  const double beta1 = std::get<0>(o.betas());
  const double beta2 = std::get<1>(o.betas());
  std::vector<at::Tensor> avg, avg_sq;
  std::vector<int64_t> steps;
  for (const auto& p : params) {
    auto* st = state_of<optim::AdamWParamState>(*this, p);
    if (!st) {
      st = &add_state<optim::AdamWParamState>(*this, p);
      st->step(0);
      st->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
      st->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
    }
    st->exp_avg(in_layout_of(st->exp_avg(), p));
    st->exp_avg_sq(in_layout_of(st->exp_avg_sq(), p));
    st->step(st->step() + 1);
    steps.push_back(st->step());
    avg.push_back(st->exp_avg());
    avg_sq.push_back(st->exp_avg_sq());
  }
#if MEMTRAIN_HAVE_FUSED_OPTIMIZERS
  if (kernel_ == StepKernel::kFused) {
    // The kernel reads each parameter's step (counted from 1) from a
    // float tensor on its device, as PyTorch keeps it; one per distinct
    // count (usually one).
    std::vector<at::Tensor> step_tensors;
    for (size_t i = 0; i < steps.size(); ++i) {
      const bool same = i > 0 && steps[i] == steps[i - 1] &&
                        params[i].device() == params[i - 1].device();
      step_tensors.push_back(
          same ? step_tensors.back()
               : at::full(
                     {},
                     static_cast<double>(steps[i]),
                     params[i].options().dtype(at::kFloat)));
    }
    at::_fused_adamw_(
        params,
        grads,
        avg,
        avg_sq,
        /*max_exp_avg_sqs=*/{},
        step_tensors,
        o.lr(),
        beta1,
        beta2,
        o.weight_decay(),
        o.eps(),
        /*amsgrad=*/false,
        /*maximize=*/false);
    return;
  }
#endif
  if (o.weight_decay() != 0)
    at::_foreach_mul_(params, 1 - o.lr() * o.weight_decay());
  at::_foreach_mul_(avg, beta1);
  at::_foreach_add_(avg, grads, 1 - beta1);
  at::_foreach_mul_(avg_sq, beta2);
  at::_foreach_addcmul_(avg_sq, grads, grads, 1 - beta2);
  std::vector<at::Scalar> root_bc2, step_size;
  for (const int64_t t : steps) {
    const double bc1 = 1 - std::pow(beta1, static_cast<double>(t));
    const double bc2 = 1 - std::pow(beta2, static_cast<double>(t));
    root_bc2.emplace_back(std::sqrt(bc2));
    step_size.emplace_back(-o.lr() / bc1);
  }
  // The denominator lives in the gradients (spent once the moments have
  // them): no temporaries. 0 + v is v exactly.
  std::vector<at::Tensor>& denom = grads;
  at::_foreach_zero_(denom);
  at::_foreach_add_(denom, avg_sq);
  at::_foreach_sqrt_(denom);
  at::_foreach_div_(denom, root_bc2);
  at::_foreach_add_(denom, o.eps());
  at::_foreach_addcdiv_(params, avg, denom, step_size);
}

std::vector<at::Tensor> gradients_of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined())
      grads.push_back(p.grad());
  }
  return grads;
}

at::Tensor clip_gradients(
    const std::vector<at::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> grads = gradients_of(params);
  if (grads.empty())
    return {};
  const std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2);
  const at::Tensor total =
      norms.size() == 1 ? norms[0] : at::stack(norms).norm(2);
  const at::Tensor coef =
      at::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);
#if MEMTRAIN_HAVE_FOREACH_MUL_BY_TENSOR
  at::_foreach_mul_(grads, coef);
#else
  for (auto& g : grads)
    g.mul_(coef);
#endif
  return total;
}

template class MultiTensor<optim::SGD, optim::SGDOptions>;
template class MultiTensor<optim::AdamW, optim::AdamWOptions>;

}  // namespace memtrain
