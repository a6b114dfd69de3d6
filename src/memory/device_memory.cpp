#include "memtrain/memory/device_memory.h"

#include <atomic>

#include "memory_backend.h"
#include "memtrain/util/error.h"

namespace memtrain::memory {
namespace {

std::atomic<MemoryBackend*> g_backend{nullptr};

}  // namespace

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
  return b ? b->stats() : Stats{};
}

void reset_peak() {
  if (MemoryBackend* b = g_backend.load())
    b->reset_peak();
}

int64_t release_cache() {
  MemoryBackend* b = g_backend.load();
  return b ? b->release_cache() : 0;
}

void set_cap(int64_t bytes) {
  if (MemoryBackend* b = g_backend.load())
    b->set_cap(bytes);
}

std::string write_snapshot(const std::string& dir) {
  MemoryBackend* b = g_backend.load();
  return b ? b->write_snapshot(dir) : std::string();
}

#if !MEMTRAIN_CUDA
void use_cuda_allocator(int /*device_index*/, const std::string& /*conf*/) {
  throw Error(
      "the CUDA caching allocator is not part of this build "
      "(MEMTRAIN_CUDA=0); rebuild with -DMEMTRAIN_CUDA=ON against a CUDA "
      "LibTorch");
}
#endif

}  // namespace memtrain::memory
