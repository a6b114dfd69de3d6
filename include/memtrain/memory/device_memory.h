#pragma once
// Device memory: what the budget, the monitor, the planner and the OOM guard
// read and control, whatever the build.
//
// CPU build: `install_cpu_accounting()` replaces LibTorch's CPU allocator by
// an accounting allocator (see Note [CPU accounting allocator] in
// accounting_allocator.cpp). Allocations made while a DeviceScope is open
// (and no HostScope on the calling thread) belong to the "device" domain:
// they are counted, cached like CUDA's caching allocator caches blocks, and
// capped; passing the cap throws LibTorch's c10::OutOfMemoryError, as a CUDA
// out-of-memory does. Everything else is the "host" domain: counted only.
// That makes every memory behaviour testable without a GPU.

#include <cstdint>

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
  int64_t cache_releases = 0;  // release_cache() calls that freed something
  double cache_release_seconds = 0.0;
};

// Installs the accounting allocator (idempotent; before the first tensor
// that should be counted). Without it, stats() returns zeros.
void install_cpu_accounting();
bool accounting_installed();

Stats stats();
// Starts a new peak: peak_* become the current values.
void reset_peak();
// Frees cached device blocks; returns the bytes given back. Counted in
// stats().cache_releases when it freed anything.
int64_t release_cache();
// Caps the device domain's reserved bytes (0: no cap). A request that would
// pass the cap first releases the cache, then throws c10::OutOfMemoryError.
void set_cap(int64_t bytes);

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
