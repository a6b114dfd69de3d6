#pragma once
// The loop's device-to-host reads, in one place that counts them. See
// Note [One host read per window] in host_sync.cpp.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace memtrain {

// Host reads and device waits of this process so far (read_to_host() and
// DeviceClock::finish()); a window's record takes the difference.
int64_t host_syncs();
// Counts one host sync: for waits that are not a tensor read
// (DeviceClock::finish()).
void count_host_sync();

// The float values of `t` (any device, any floating or integral type, at
// most a few elements: flags and totals), on the host: one counted sync.
std::vector<double> read_to_host(const at::Tensor& t);

// Multiplies every tensor of `tensors` (float32, one device) by
// `inv_scale` in place and adds 1 to `found` (a float32 (1,) tensor on
// that device) if any element is inf or NaN -- on the device, no host
// read: on CUDA one fused kernel (GradScaler's), on the CPU a vectorised
// exponent-bit test. inv_scale = 1 only checks (CPU: no multiply; CUDA:
// x * 1 is x, exactly).
void flag_nonfinite(
    const std::vector<at::Tensor>& tensors,
    double inv_scale,
    const at::Tensor& found);

}  // namespace memtrain
