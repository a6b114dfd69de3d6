#include "memtrain/compat.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>

#include "memtrain/util/error.h"

#if MEMTRAIN_CUDA
#if MEMTRAIN_TORCH_AT_LEAST(2, 9)
#include <c10/core/AllocatorConfig.h>
#else
#include <c10/cuda/CUDACachingAllocator.h>
#endif
#endif

namespace memtrain::compat {

at::Tensor attention_math(
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    const at::Tensor& bias,
    double scale,
    bool causal) {
  MT_INTERNAL_ASSERT(
      !(causal && bias.defined()), "attention: a bias or causal, not both");
  at::Tensor a = at::matmul(q * scale, k.transpose(-2, -1));
  if (bias.defined())
    a = a + bias.to(a.scalar_type());
  if (causal) {
    const int64_t l = q.size(-2), s = k.size(-2);
    a = a.masked_fill(
        at::ones({l, s}, q.options().dtype(at::kBool)).triu(1),
        -std::numeric_limits<double>::infinity());
  }
  return at::matmul(at::softmax(a, -1, at::kFloat).to(v.scalar_type()), v);
}

at::Tensor attention(
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    const at::Tensor& bias,
    double scale,
    bool causal) {
#if MEMTRAIN_TORCH_AT_LEAST(2, 1)
  MT_INTERNAL_ASSERT(
      !(causal && bias.defined()), "attention: a bias or causal, not both");
  std::optional<at::Tensor> mask;
  if (bias.defined())
    mask = bias.to(q.scalar_type());
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, causal, scale);
#else
  return attention_math(q, k, v, bias, scale, causal);
#endif
}

void zero_grad_to_none(torch::optim::Optimizer& optimizer) {
  // Not 2.x's Optimizer::zero_grad(true): it calls detach_() on each
  // gradient first, which throws for a view -- and gradients here are views
  // into GradientSync's buckets.
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      p.mutable_grad() = torch::Tensor();
    }
  }
}

AutocastState autocast_state() {
  AutocastState s;
#if MEMTRAIN_TORCH_AT_LEAST(2, 4)
  s.cpu_enabled = at::autocast::is_autocast_enabled(at::kCPU);
  s.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
  s.cuda_enabled = at::autocast::is_autocast_enabled(at::kCUDA);
  s.cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
#else
  s.cpu_enabled = at::autocast::is_cpu_enabled();
  s.cpu_dtype = at::autocast::get_autocast_cpu_dtype();
  s.cuda_enabled = at::autocast::is_enabled();
  s.cuda_dtype = at::autocast::get_autocast_gpu_dtype();
#endif
  return s;
}

void set_autocast_state(const AutocastState& s) {
#if MEMTRAIN_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(at::kCPU, s.cpu_enabled);
  at::autocast::set_autocast_dtype(at::kCPU, s.cpu_dtype);
  at::autocast::set_autocast_enabled(at::kCUDA, s.cuda_enabled);
  at::autocast::set_autocast_dtype(at::kCUDA, s.cuda_dtype);
#else
  at::autocast::set_cpu_enabled(s.cpu_enabled);
  at::autocast::set_autocast_cpu_dtype(s.cpu_dtype);
  at::autocast::set_enabled(s.cuda_enabled);
  at::autocast::set_autocast_gpu_dtype(s.cuda_dtype);
#endif
}

AutocastStateGuard::AutocastStateGuard(const AutocastState& state)
    : saved_(autocast_state()) {
  set_autocast_state(state);
  at::autocast::increment_nesting();
}

AutocastStateGuard::~AutocastStateGuard() {
  if (at::autocast::decrement_nesting() == 0)
    at::autocast::clear_cache();
  set_autocast_state(saved_);
}

AutocastGuard::AutocastGuard(bool enabled, bool cuda, c10::ScalarType dtype) {
  if (!enabled)
    return;
  AutocastState s = autocast_state();
  if (cuda) {
    s.cuda_enabled = true;
    s.cuda_dtype = dtype;
  } else {
    s.cpu_enabled = true;
    s.cpu_dtype = dtype;
  }
  region_.emplace(s);
}

namespace {

// Prints each distinct warning once per process ("memtrain: warning
// (printed once): ..."): an op without a deterministic algorithm warns at
// every call, so every micro-step. Warnings raised in backward reach the
// thread that called it (autograd replays them there), so the loop's
// thread is the one to install this on.
class OnceWarningHandler : public c10::WarningHandler {
 public:
#if MEMTRAIN_TORCH_AT_LEAST(2, 0)
  void process(const c10::Warning& warning) override {
    print(warning.msg());
  }
#else
  void process(
      const c10::SourceLocation& /*where*/,
      const std::string& msg,
      const bool /*verbatim*/) override {
    print(msg);
  }
#endif

 private:
  void print(const std::string& msg) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (seen_.insert(msg).second)
      std::fprintf(
          stderr, "memtrain: warning (printed once): %s\n", msg.c_str());
  }
  std::mutex mutex_;
  std::unordered_set<std::string> seen_;
};

}  // namespace

void print_warnings_once() {
  static OnceWarningHandler handler;
#if MEMTRAIN_TORCH_AT_LEAST(2, 0)
  c10::WarningUtils::set_warning_handler(&handler);
#else
  c10::Warning::set_warning_handler(&handler);
#endif
}

void set_deterministic(bool on) {
  if (!on)
    return;
  auto& ctx = at::globalContext();
  // warn_only: an op without a deterministic algorithm warns (once, here)
  // instead of failing.
  print_warnings_once();
  ctx.setDeterministicAlgorithms(true, /*warn_only=*/true);
  ctx.setDeterministicCuDNN(true);
  ctx.setBenchmarkCuDNN(false);
#if MEMTRAIN_TORCH_AT_LEAST(2, 10)
  ctx.setFloat32Precision(
      at::Float32Backend::CUDA,
      at::Float32Op::MATMUL,
      at::Float32Precision::IEEE);
  ctx.setFloat32Precision(
      at::Float32Backend::CUDA,
      at::Float32Op::CONV,
      at::Float32Precision::IEEE);
#else
  ctx.setAllowTF32CuBLAS(false);
  ctx.setAllowTF32CuDNN(false);
#endif
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
}

#if MEMTRAIN_CUDA
void init_cuda() {
#if MEMTRAIN_TORCH_AT_LEAST(2, 6)
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
#else
  at::globalContext().lazyInitCUDA();
#endif
}

void set_cuda_allocator_settings(const std::string& conf) {
#if MEMTRAIN_TORCH_AT_LEAST(2, 9)
  c10::CachingAllocator::setAllocatorSettings(conf);
#else
  c10::cuda::CUDACachingAllocator::setAllocatorSettings(conf);
#endif
}
#endif

}  // namespace memtrain::compat
