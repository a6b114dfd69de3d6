#pragma once
// Device memory: what the budget, the monitor, the planner and the OOM guard
// read and control, whatever the device. One interface, two
// implementations, chosen once per process by the placement
// (device/placement.h) before the first tensor:
//
// - CPU device: `install_cpu_accounting()` replaces LibTorch's CPU allocator
//   by an accounting allocator (see Note [CPU accounting allocator] in
//   accounting_allocator.cpp). Allocations made while a DeviceScope is open
//   (and no HostScope on the calling thread) belong to the "device" domain:
//   they are counted, cached like CUDA's caching allocator caches blocks,
//   and capped; passing the cap throws LibTorch's c10::OutOfMemoryError, as
//   a CUDA out-of-memory does. Everything else is the "host" domain: counted
//   only. That makes every memory behaviour testable without a GPU.
// - CUDA device (MEMTRAIN_CUDA builds): `use_cuda_allocator()` routes the
//   same calls to LibTorch's CUDA caching allocator of the rank's GPU (see
//   Note [CUDA memory backend] in cuda_memory.cpp): the cap is the
//   per-process memory fraction, the stats are the allocator's own.
//   DeviceScope and HostScope change nothing there: device memory is the
//   GPU's.

#include <cstdint>
#include <string>

#include "memtrain/memory/allocator_conf.h"

namespace memtrain::memory {

struct Stats {
  int64_t allocated = 0;       // device domain: bytes in live tensors
  int64_t reserved = 0;        // allocated + cached free blocks
  int64_t peak_allocated = 0;  // since reset_peak()
  int64_t peak_reserved = 0;
  int64_t cap = 0;             // 0: no cap
  int64_t host_allocated = 0;  // host domain
  int64_t host_peak = 0;
  int64_t num_ooms = 0;        // out-of-memory errors thrown
  int64_t alloc_retries = 0;   // CUDA: allocations retried after a flush
  int64_t cache_releases = 0;  // release_cache() calls that freed something
  double cache_release_seconds = 0.0;
};

// Installs the accounting allocator and makes it the backend (idempotent;
// before the first tensor that should be counted).
void install_cpu_accounting();
bool accounting_installed();

// CUDA builds: makes CUDA's caching allocator of GPU `device_index` the
// backend, after applying `allocator_conf` (PYTORCH_CUDA_ALLOC_CONF syntax,
// "" for LibTorch's defaults) -- which must happen before the process's
// first CUDA allocation, so call it first thing. Throws memtrain::Error on
// a build without CUDA or when settings cannot be applied.
// `allocator_conf` is merged with PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF
// first (memory/allocator_conf.h); a refused combination throws
// memtrain::Error. CUDA is initialised before it returns (Note [CUDA start-up
// order]), so stats(), reset_peak() and set_cap() work before any tensor.
void use_cuda_allocator(int device_index, const std::string& allocator_conf);

// The settings use_cuda_allocator() applied, each with where it came from;
// empty before it ran and on a CPU device.
AllocatorSettings cuda_allocator_settings();

// "cpu-accounting", "cuda-caching", or "none" (nothing installed: stats()
// returns zeros and the cap does nothing).
std::string backend_name();

// Writes what the allocator holds (segments, blocks, sizes) as JSON into
// `dir`, for an out-of-memory post-mortem; returns the file's path, or ""
// where the backend has no snapshot (the CPU accounting allocator).
std::string write_snapshot(const std::string& dir);

Stats stats();
// Starts a new peak: peak_* become the current values.
void reset_peak();

// The peak of allocated device bytes while it lives, without changing what
// stats() reports (Note [Peak scopes] in device_memory.cpp): the peaks
// before it are kept and merged back. One at a time (they do not nest);
// from the thread that computes.
class PeakScope {
 public:
  PeakScope();
  ~PeakScope();
  PeakScope(const PeakScope&) = delete;
  PeakScope& operator=(const PeakScope&) = delete;
  // The most allocated since the scope began.
  int64_t peak() const;
};
// Frees cached device blocks; returns the bytes given back. Counted in
// stats().cache_releases when it freed anything.
int64_t release_cache();
// Caps the device domain's reserved bytes (0: no cap). A request that would
// pass the cap first releases the cache, then throws c10::OutOfMemoryError.
// CUDA: the per-process memory fraction cap / total (0: the whole GPU).
void set_cap(int64_t bytes);

// What the process holds on the device outside the allocator, for a budget
// that is the whole process's (Note [A budget is the whole process] in
// cuda_memory.cpp): CUDA loads cuBLAS and cuDNN (a matrix product and a
// convolution), releases the cache, and returns the device's used bytes
// less the allocator's reserved ones; 0 on the CPU, where the accounting
// allocator is the whole device.
int64_t measure_outside();

// The device memory in use, as the device reports it (CUDA:
// cudaMemGetInfo's total - free: the context, the libraries, NCCL and the
// allocator's segments, and any other process on that GPU); -1 where the
// backend cannot say (the CPU).
int64_t device_used_bytes();

// Throws memtrain::Error when the device reports more in use than
// `budget_bytes` (> 0), naming `budget` ("memory.budget=v100-16gb"), the
// allocator's share and what is outside it (`outside_at_start`, as
// measure_outside() returned); does nothing for 0 or where
// device_used_bytes() is unknown. Called at every window boundary.
void check_device_within(
    int64_t budget_bytes, int64_t outside_at_start, const std::string& budget);

// While at least one DeviceScope is alive (any thread), allocations belong
// to the device domain. Nestable.
class DeviceScope {
 public:
  DeviceScope();
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
};

// On the calling thread, allocations belong to the host domain even inside a
// DeviceScope (reader threads, host-side aggregation buffers). Nestable.
class HostScope {
 public:
  HostScope();
  ~HostScope();
  HostScope(const HostScope&) = delete;
  HostScope& operator=(const HostScope&) = delete;
};

}  // namespace memtrain::memory
