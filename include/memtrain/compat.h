#pragma once
// The one place where LibTorch versions differ for memtrain: Debian's
// LibTorch 1.13 (CPU: development machines, CI) and LibTorch 2.x from a
// PyTorch install (CUDA: GPU machines and clusters). Nothing else in the tree
// tests TORCH_VERSION_*.

#include <torch/version.h>

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

}  // namespace memtrain::compat
