#pragma once
// The loop's device-to-host reads, in one place that counts them. See
// Note [One host read per window] in host_sync.cpp.

#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace memtrain {

// Host reads and device waits of this process so far (read_to_host() and
// DeviceClock::finish()); a window's record takes the difference.
int64_t host_syncs();
// Counts one host sync: for waits that are not a tensor read
// (DeviceClock::finish()).
void count_host_sync();

// How the host waits for a device event: calls `done` until it is true.
// The window passes Communicator::wait_for_device, which also watches the
// collectives queued before the read for NCCL's errors and dist.timeout_s.
using DeviceWait = std::function<void(const std::function<bool()>& done)>;

// The values of `t` (any device, any floating or integral type, at most a
// few elements: flags and totals) as doubles on the host: one counted
// sync. A device tensor is copied into page-locked memory behind the work
// queued on the current stream, and the host waits for that copy with
// `wait` (empty: a yielding poll).
std::vector<double> read_to_host(
    const at::Tensor& t, const DeviceWait& wait = {});

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
