#pragma once
// The one place where LibTorch versions differ for memtrain: Debian's
// LibTorch 1.13 (CPU: development machines, CI) and LibTorch 2.x from a
// PyTorch install (CUDA: GPU machines and clusters). Nothing else in the tree
// tests TORCH_VERSION_*.

#include <c10/core/ScalarType.h>
#include <torch/version.h>

#include <optional>

#define MEMTRAIN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||           \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#ifndef MEMTRAIN_CUDA
#define MEMTRAIN_CUDA 0
#endif

namespace torch::optim {
class Optimizer;
}

namespace memtrain::compat {

// Drops every parameter's gradient (set to none, not zero): the memory is
// released and the next backward allocates fresh. 2.x does this in
// Optimizer::zero_grad(); 1.13's zero_grad() only zeroes in place.
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

}  // namespace memtrain::compat
