#pragma once
// The one place where LibTorch versions differ for memtrain: Debian's
// LibTorch 1.13 (the CPU build: development machines, CI) and the torch
// wheels' LibTorch for the CUDA build (-DMEMTRAIN_CUDA=ON: GPU machines and
// clusters): 2.11 for CUDA 13 (CI builds it and runs its CPU tests) and
// 2.10 for CUDA 12.8, the V100s' (CI builds memtrain against it). Nothing
// else in the tree tests TORCH_VERSION_*.

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/ScalarType.h>
#include <torch/version.h>

#include <optional>
#include <string>
#include <variant>

#define MEMTRAIN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||           \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#ifndef MEMTRAIN_CUDA
#define MEMTRAIN_CUDA 0
#endif

// The CUDA build compiles against the torch wheel's LibTorch (2.11); an
// older version here means Debian's LibTorch 1.13 headers in /usr/include
// were found instead.
static_assert(
    !MEMTRAIN_CUDA || MEMTRAIN_TORCH_AT_LEAST(2, 4),
    "MEMTRAIN_CUDA builds need LibTorch >= 2.4 (the torch wheel)");

// LibTorch's fused AdamW and SGD kernels (at::_fused_adamw_,
// at::_fused_sgd_, for CPU and CUDA tensors): in the CUDA build's LibTorch,
// not in 1.13 (src/train/state/optimizers.cpp).
#define MEMTRAIN_HAVE_FUSED_OPTIMIZERS MEMTRAIN_TORCH_AT_LEAST(2, 4)
// at::_foreach_mul_(list, tensor): every tensor of a list times a 0-d
// tensor, without reading it. 1.13 has none, and there the call would
// compile as list-times-list (a tensor converts to a list of one) and fail
// when run.
#define MEMTRAIN_HAVE_FOREACH_MUL_BY_TENSOR MEMTRAIN_TORCH_AT_LEAST(2, 4)

namespace torch::optim {
class Optimizer;
}

namespace memtrain::compat {

// Alternative I of a LibTorch option variant (a convolution's padding):
// c10::variant in 1.13, std::variant in the CUDA build's LibTorch. The
// call is unqualified so that argument-dependent lookup finds c10::get for
// a c10::variant.
template <size_t I, typename V>
decltype(auto) variant_get(const V& v) {
#if MEMTRAIN_TORCH_AT_LEAST(2, 4)
  return std::get<I>(v);
#else
  using std::get;
  return get<I>(v);
#endif
}

// A c10::Allocator whose allocation is allocate_block(). 1.13 declares
// `allocate(size_t) const` and nothing else to implement; 2.11 declares a
// non-const allocate() and a pure virtual copy_data() (here c10's
// default_copy_data, a memcpy). The gate is the CUDA build's minimum version.
class Allocator : public c10::Allocator {
 public:
#if MEMTRAIN_TORCH_AT_LEAST(2, 4)
  c10::DataPtr allocate(size_t nbytes) override {
    return allocate_block(nbytes);
  }
  void copy_data(void* dest, const void* src, size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t nbytes) const override {
    return const_cast<Allocator*>(this)->allocate_block(nbytes);
  }
#endif

 protected:
  virtual c10::DataPtr allocate_block(size_t nbytes) = 0;
};

// Drops every parameter's gradient (set to none, not zero): the memory is
// released and the next backward allocates fresh. 1.13's
// Optimizer::zero_grad() only zeroes in place; 2.11's zero_grad(true)
// refuses gradients that are views (GradientSync's buckets).
void zero_grad_to_none(torch::optim::Optimizer& optimizer);

// Autocast's thread-local state for CPU and CUDA. 1.13 has per-device
// functions (is_cpu_enabled, get_autocast_cpu_dtype, ...); 2.4 replaced them
// with functions taking a device type.
struct AutocastState {
  bool cpu_enabled = false;
  c10::ScalarType cpu_dtype = c10::ScalarType::BFloat16;
  bool cuda_enabled = false;
  c10::ScalarType cuda_dtype = c10::ScalarType::Half;
};
AutocastState autocast_state();
void set_autocast_state(const AutocastState& state);

// Sets `state` for its lifetime as an autocast region of its own: nesting is
// counted and, when the outermost region ends, autocast's cache of
// down-cast weights is cleared -- otherwise casts made here (a checkpointed
// segment's recompute in backward) would outlive the optimizer step and feed
// stale weights to the next forward.
class AutocastStateGuard {
 public:
  explicit AutocastStateGuard(const AutocastState& state);
  ~AutocastStateGuard();
  AutocastStateGuard(const AutocastStateGuard&) = delete;
  AutocastStateGuard& operator=(const AutocastStateGuard&) = delete;

 private:
  AutocastState saved_;
};

// Enables autocast to `dtype` on `cuda` or CPU for its lifetime (nothing
// when `enabled` is false), restoring the previous state and clearing the
// cast cache when the outermost guard ends, as torch.autocast does.
class AutocastGuard {
 public:
  AutocastGuard(bool enabled, bool cuda, c10::ScalarType dtype);

 private:
  std::optional<AutocastStateGuard> region_;
};

// Multi-head attention: softmax(q k^T * scale + bias) v, for q, k, v of
// (N, H, L, E) and a bias broadcastable to (N, H, L, L), or undefined (no
// bias); `causal`: position i attends to positions <= i only (the text
// transformer's mask; not with a bias). No dropout. LibTorch 2.x:
// at::scaled_dot_product_attention (a GPU gets its fused kernels: flash
// attention for no bias or causal); 1.13 has none: attention_math(). Both
// in the dtype of q (the softmax in float32 on the math path).
at::Tensor attention(
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    const at::Tensor& bias,
    double scale,
    bool causal = false);

// The same written out as MONAI's WindowAttention computes it: (q * scale)
// k^T + bias (or the causal mask: -inf above the diagonal), softmax over the
// last axis in float32, cast back, times v.
at::Tensor attention_math(
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    const at::Tensor& bias,
    double scale,
    bool causal = false);

// training.deterministic: LibTorch's deterministic algorithms (warning, not
// failing, where an op has none), cuDNN deterministic and not benchmarking,
// no TF32 in cuBLAS and cuDNN (IEEE float32: 2.10's float32 precision API;
// its setAllowTF32CuBLAS/CuDNN warn that they are deprecated), and
// CUBLAS_WORKSPACE_CONFIG=:4096:8 when unset (cuBLAS's condition for
// reproducible results). Process-wide; call before the first CUDA matrix
// product. false leaves LibTorch's defaults.
void set_deterministic(bool on);

// From here on the calling thread prints each distinct LibTorch warning
// once per process ("memtrain: warning (printed once): ..."), backward's
// included (autograd replays them on the thread that called backward).
// set_deterministic(true) calls it: an op without a deterministic
// algorithm would warn at every micro-step.
void print_warnings_once();

#if MEMTRAIN_CUDA
// CUDA's lazy initialisation now (it starts the caching allocator: Note
// [CUDA start-up order]). 2.6 replaced lazyInitCUDA() with
// lazyInitDevice(kCUDA); 2.11 warns on the former.
void init_cuda();

// Applies CUDA caching allocator settings (PYTORCH_CUDA_ALLOC_CONF syntax)
// before the first CUDA allocation. 2.9 moved the parser from
// c10::cuda::CUDACachingAllocator to c10::CachingAllocator.
void set_cuda_allocator_settings(const std::string& conf);
#endif

}  // namespace memtrain::compat
