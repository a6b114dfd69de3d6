#include "memtrain/memory/device_memory.h"

#include <algorithm>
#include <atomic>
#include <mutex>

#include "memory_backend.h"
#include "memtrain/util/error.h"

namespace memtrain::memory {
namespace {

std::atomic<MemoryBackend*> g_backend{nullptr};

// The peaks a PeakScope restarted, which stats() still reports (Note [Peak
// scopes]).
std::mutex g_carried_mu;
Stats g_carried;  // peak_allocated, peak_reserved, host_peak
bool g_in_scope = false;

}  // namespace

// Note [Peak scopes]
// ~~~~~~~~~~~~~~~~~~
// The window record's mem_peak is the device's peak since the window
// began (Monitor::begin_window resets it). A model that reports the peaks
// of its own phases (the frozen backbone's extraction, the context's)
// needs a peak of its own inside that window without losing the window's:
// a PeakScope notes the peaks so far, restarts them, and on leaving folds
// what it noted back in, kept here and merged into every stats() until the
// next reset_peak(). So the window's peak is the same with or without the
// scopes, and each scope's peak() is its own phase's.

void activate_backend(MemoryBackend* backend) {
  MemoryBackend* expected = nullptr;
  if (!g_backend.compare_exchange_strong(expected, backend)) {
    MT_INTERNAL_ASSERT(
        expected == backend,
        "device memory backend '",
        expected->name(),
        "' is active; '",
        backend->name(),
        "' cannot replace it (one device per process)");
  }
}

void install_cpu_accounting() {
  activate_backend(cpu_accounting_backend());
}

bool accounting_installed() {
  MemoryBackend* b = g_backend.load();
  return b != nullptr && b->name() == "cpu-accounting";
}

std::string backend_name() {
  MemoryBackend* b = g_backend.load();
  return b ? b->name() : "none";
}

Stats stats() {
  MemoryBackend* b = g_backend.load();
  Stats s = b ? b->stats() : Stats{};
  std::lock_guard<std::mutex> lock(g_carried_mu);
  s.peak_allocated = std::max(s.peak_allocated, g_carried.peak_allocated);
  s.peak_reserved = std::max(s.peak_reserved, g_carried.peak_reserved);
  s.host_peak = std::max(s.host_peak, g_carried.host_peak);
  return s;
}

void reset_peak() {
  {
    std::lock_guard<std::mutex> lock(g_carried_mu);
    g_carried = Stats{};
  }
  if (MemoryBackend* b = g_backend.load())
    b->reset_peak();
}

PeakScope::PeakScope() {
  MemoryBackend* b = g_backend.load();
  const Stats now = stats();
  std::lock_guard<std::mutex> lock(g_carried_mu);
  MT_INTERNAL_ASSERT(!g_in_scope, "PeakScopes do not nest");
  g_in_scope = true;
  g_carried.peak_allocated = now.peak_allocated;
  g_carried.peak_reserved = now.peak_reserved;
  g_carried.host_peak = now.host_peak;
  if (b != nullptr)
    b->reset_peak();
}

PeakScope::~PeakScope() {
  std::lock_guard<std::mutex> lock(g_carried_mu);
  g_in_scope = false;
}

int64_t PeakScope::peak() const {
  MemoryBackend* b = g_backend.load();
  return b ? b->stats().peak_allocated : 0;
}

int64_t release_cache() {
  MemoryBackend* b = g_backend.load();
  return b ? b->release_cache() : 0;
}

void set_cap(int64_t bytes) {
  if (MemoryBackend* b = g_backend.load())
    b->set_cap(bytes);
}

int64_t device_used_bytes() {
  MemoryBackend* b = g_backend.load();
  return b ? b->device_used_bytes() : -1;
}

int64_t measure_outside() {
  MemoryBackend* b = g_backend.load();
  return b ? b->measure_outside() : 0;
}

void check_device_within(
    int64_t budget_bytes, int64_t outside_at_start, const std::string& budget) {
  MemoryBackend* b = g_backend.load();
  if (b == nullptr || budget_bytes <= 0)
    return;
  const int64_t used = b->device_used_bytes();
  if (used < 0 || used <= budget_bytes)
    return;
  const Stats s = b->stats();
  throw Error(detail::concat(
      budget,
      " (",
      format_bytes(static_cast<double>(budget_bytes)),
      ") is the whole process's, but the device reports ",
      format_bytes(static_cast<double>(used)),
      " in use at a window boundary: the caching allocator reserves ",
      format_bytes(static_cast<double>(s.reserved)),
      ", and ",
      format_bytes(static_cast<double>(used - s.reserved)),
      " is outside it (",
      format_bytes(static_cast<double>(outside_at_start)),
      " at start-up: the CUDA context, cuBLAS/cuDNN and NCCL; since then "
      "kernels loaded lazily, or another process on this GPU). On the card "
      "the budget names this run would run out of memory. Give this rank a "
      "GPU of its own, or raise memory.headroom so that the allocator leaves "
      "room"));
}

std::string write_snapshot(const std::string& dir) {
  MemoryBackend* b = g_backend.load();
  return b ? b->write_snapshot(dir) : std::string();
}

#if !MEMTRAIN_CUDA
AllocatorSettings cuda_allocator_settings() {
  return {};
}

void use_cuda_allocator(int /*device_index*/, const std::string& /*conf*/) {
  throw Error(
      "the CUDA caching allocator is not part of this build "
      "(MEMTRAIN_CUDA=0); rebuild with -DMEMTRAIN_CUDA=ON against a CUDA "
      "LibTorch");
}
#endif

}  // namespace memtrain::memory
