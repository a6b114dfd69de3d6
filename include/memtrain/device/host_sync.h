#pragma once
// The loop's device-to-host reads, in one place that counts them. See
// Note [One host read per window] in host_sync.cpp.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace at {
struct RecordFunction;
}

namespace memtrain {

// Host reads and device waits of this process so far (HostSync spans: in
// read_to_host(), DeviceClock::finish(), NCCL's waits); a window's record
// takes the difference.
int64_t host_syncs();

// One host sync, for as long as it lives: counted (host_syncs()) and marked
// as the user scope "memtrain::host_sync" for LibTorch's RecordFunction
// observers (a profiler's trace shows its span; HostReadWatch tells a read
// inside one from a bare one). Made where the host waits.
class HostSync {
 public:
  HostSync();
  ~HostSync();
  HostSync(const HostSync&) = delete;
  HostSync& operator=(const HostSync&) = delete;

 private:
  std::unique_ptr<at::RecordFunction> scope_;
};

// Note [Host reads seen by the dispatcher]: while one lives, the operator
// calls of the thread that made it are watched through a thread-local
// RecordFunction callback: each HostSync span begun, and each bare host
// read -- aten::_local_scalar_dense (item(), bool(t), ...) or a copy from
// a device to the host -- outside one. Nothing is watched when `on` is
// false.
class HostReadWatch {
 public:
  explicit HostReadWatch(bool on);
  ~HostReadWatch();
  HostReadWatch(const HostReadWatch&) = delete;
  HostReadWatch& operator=(const HostReadWatch&) = delete;

  bool on() const {
    return state_ != nullptr;
  }
  // HostSync spans begun plus bare reads, as the dispatcher saw them.
  int64_t seen() const;
  // The bare reads in order, comma separated ("aten::_local_scalar_dense",
  // with its device where LibTorch has CUDA); empty when there were none.
  std::string bare() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// How the window loop watches its host reads: MEMTRAIN_WATCH_HOST_READS
// unset or 0: not at all; 1: each window's record holds what the
// dispatcher saw (host_syncs_seen) and a window with a bare read is named
// on stderr; strict: such a window stops the run with an error (the test
// suite's setting). Anything else is refused by name.
enum class HostReadWatching { kOff, kRecord, kStrict };
HostReadWatching host_read_watching();

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
