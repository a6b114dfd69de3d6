#pragma once
// Placement: the device a rank trains on, chosen once per process from
// dist.device and carried everywhere. It owns what differs between a CPU
// and a CUDA device: where the model, optimizer state, gradient buckets and
// batches live; the host-to-device copy; the autocast device type; the
// random generators; and which device-memory backend (memory/
// device_memory.h) answers the budget, the monitor and the OOM guard. The
// CLI, the trainer, the validator and the planner ask it; nobody writes a
// device literal. See Note [Placement] in placement.cpp.

#include <c10/core/Device.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "memtrain/config/choices.h"

namespace memtrain {

// The generators a training step draws from: the CPU's and, on a CUDA
// device, the GPU's (dropout runs where the tensors are). Host tensors of
// bytes, as Generator::get_state() returns them; `device` is undefined on
// a CPU placement.
struct RngState {
  at::Tensor cpu;
  at::Tensor device;
};

// Note [Window clock]
// Times of a window as the device ran it. mark() notes the point the
// device's queue has reached: on the CPU, where work is done when it is
// issued, the host's clock now; on CUDA an event recorded on the current
// stream, which completes when the device gets there. finish() waits for
// the last mark (a host sync, counted: Note [One host read per window])
// and returns each mark's seconds after the first. So work the host
// queued asynchronously is billed to the phase that queued it (the
// optimizer step to t_optimizer_s, not to the next window's compute).
class DeviceClock {
 public:
  virtual ~DeviceClock() = default;
  virtual void mark() = 0;
  virtual std::vector<double> finish() = 0;
};

class Placement {
 public:
  virtual ~Placement() = default;

  // dist.device: cpu, cuda (GPU <local_rank> modulo the GPUs visible)
  // or auto (cuda when this build has CUDA and LibTorch sees a GPU, else
  // cpu; a CUDA build that falls back says why on stderr, from local rank
  // 0: auto_fallback_reason()). Activates the device-memory backend (CPU
  // accounting allocator, or the CUDA caching allocator with
  // `allocator_conf`): call it once, before the process's first tensor.
  // Throws memtrain::Error naming the build and what it found when cuda is
  // asked for where there is none.
  static std::unique_ptr<Placement> choose(
      DeviceChoice spec, int local_rank, const std::string& allocator_conf);

  // Why dist.device=auto runs a CUDA build on the CPU: the line choose()
  // prints (the CUDA runtime's error, e.g. a driver older than the
  // runtime, the driver's version, CUDA_VISIBLE_DEVICES). Empty in a CPU
  // build (the CPU is what it is for) or where a GPU is visible.
  static std::string auto_fallback_reason();

  // A CPU placement with the accounting allocator (tests, benchmarks).
  static std::unique_ptr<Placement> cpu();

  const c10::Device& device() const {
    return device_;
  }
  bool is_cuda() const {
    return device_.is_cuda();
  }
  // "cpu" or "cuda:0 (NVIDIA H100 80GB HBM3, 79.1 GiB)", for the banner,
  // environment.json and the rank logs.
  virtual std::string describe() const = 0;

  // Whether host batch buffers should be page-locked (so copies can be
  // asynchronous).
  virtual bool pinned_host_buffers() const = 0;

  // The host-to-device copy of a batch tensor. CPU: a copy into the device
  // memory domain (memory::DeviceScope), as a transfer to a GPU would
  // allocate there. CUDA: a non-blocking copy (from page-locked memory) on
  // the placement's copy stream, which the current stream then waits for
  // through an event; the host does not wait. Either way the result is
  // this device's. `host` must not be written again before copies_done()
  // has returned (freeing it is safe: LibTorch's pinned-memory cache waits
  // for the copy itself).
  virtual at::Tensor to_device(const at::Tensor& host) const = 0;
  // Blocks until the copies to_device() has issued so far are done with
  // their host tensors: the prefetcher calls it on a reader thread before
  // it reads into a recycled buffer. Empty on the CPU (copies are done on
  // return).
  virtual std::function<void()> copies_done() const {
    return {};
  }

  // A clock of the device's queue (Note [Window clock]), started: its
  // first mark is now.
  virtual std::unique_ptr<DeviceClock> start_clock() const;

  // A device tensor's copy in host memory (memory::HostScope), for sums
  // kept on the host; blocks until it is there.
  at::Tensor to_host(const at::Tensor& t) const;

  // Makes every generator this rank draws from start from a stream of its
  // own, derived from (seed, rank): dropout and other random draws differ
  // between ranks and repeat between runs.
  void seed_rng(uint64_t seed, int rank) const;
  RngState rng_state() const;
  void set_rng_state(const RngState& state) const;

 protected:
  explicit Placement(c10::Device device) : device_(device) {}

 private:
  c10::Device device_;
};

// What this build and machine offer, one "key value" line each, for
// `memtrain probe` (tests/gpu/probe.sh): "torch 2.11.0", "cuda_build 13.0"
// (or none), "cuda_driver 13.0" (or none), "nccl 2.28.9" (or none),
// "devices N", then "device I: NAME, BYTES" per visible GPU. Makes no CUDA
// context (device properties only).
std::string probe_devices();

// The seed of rank `rank`'s stream: SplitMix64 of (seed, rank), so nearby
// seeds and ranks give unrelated streams.
uint64_t rank_seed(uint64_t seed, int rank);

}  // namespace memtrain
