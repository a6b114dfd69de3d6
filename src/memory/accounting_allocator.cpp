#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "memory_backend.h"
#include "memtrain/compat.h"
#include "memtrain/memory/block_pool.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/util/error.h"

namespace memtrain::memory {

// Note [CPU accounting allocator]
// LibTorch lets a program replace its CPU allocator
// (c10::SetCPUAllocator). Ours tags every block with a domain when it is
// allocated: "device" while a DeviceScope is open and the thread is not in a
// HostScope, else "host". Device blocks behave like CUDA's caching
// allocator's: they come from a BlockPool (Note [CPU block pool]), freed
// blocks stay cached, and the cap applies to reserved bytes (what is
// resident for the pool). A request that would pass the cap releases the
// free blocks and tries again, then throws c10::OutOfMemoryError -- which
// unwinds a forward or backward cleanly, freeing the graph. Host blocks are
// glibc's, counted only.
// oneDNN calls raw_allocate(), which needs the DataPtr's context to be its
// data pointer and a non-null raw_deleter: so host block sizes live in a
// side table, not in the context.

namespace {

constexpr size_t kAlignment = 64;  // as c10's default CPU allocator

enum class Domain : uint8_t { kHost, kDevice };

std::atomic<int> g_device_depth{0};
thread_local int t_host_depth = 0;

Domain current_domain() {
  return (g_device_depth.load(std::memory_order_relaxed) > 0 &&
          t_host_depth == 0)
             ? Domain::kDevice
             : Domain::kHost;
}

class AccountingAllocator final : public compat::Allocator {
 public:
  c10::DataPtr allocate_block(size_t nbytes) override {
    if (nbytes == 0) {
      return {nullptr, nullptr, &raw_free, c10::Device(c10::DeviceType::CPU)};
    }
    void* p = take(nbytes);
    return {p, p, &raw_free, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &raw_free;
  }

  Stats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return s_;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    s_.peak_allocated = s_.allocated;
    s_.peak_reserved = s_.reserved;
    s_.host_peak = s_.host_allocated;
  }

  void set_cap(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    s_.cap = bytes;
  }

  int64_t release_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    return release_locked();
  }

  static AccountingAllocator& instance() {
    static AccountingAllocator* a = new AccountingAllocator();  // never freed:
    return *a;  // tensors may outlive static destruction
  }

 private:
  static void raw_free(void* p) {
    if (p)
      instance().give_back(p);
  }

  void* take(size_t nbytes) {
    const Domain domain = current_domain();
    std::unique_lock<std::mutex> lock(mu_);
    if (domain == Domain::kHost) {
      void* p = raw_alloc(nbytes);
      host_blocks_.emplace(p, nbytes);
      s_.host_allocated += static_cast<int64_t>(nbytes);
      s_.host_peak = std::max(s_.host_peak, s_.host_allocated);
      return p;
    }
    const int64_t releases_before = pool_.releases();
    const auto start = std::chrono::steady_clock::now();
    const BlockPool::Taken t = pool_.take(nbytes, s_.cap);
    if (pool_.releases() > releases_before)  // the cap released blocks
      count_release(start);  // (the time includes the retry's mapping)
    if (t.ptr == nullptr) {
      if (t.over_cap)
        ++s_.num_ooms;
      sync_locked();  // what a release before the refusal gave back
      const Stats snap = s_;
      lock.unlock();
      TORCH_CHECK_WITH(
          OutOfMemoryError,
          false,
          t.over_cap ? "out of device memory (memtrain CPU accounting): "
                     : "host out of memory (the kernel refused memory for "
                       "the CPU device's blocks): ",
          "tried to allocate ",
          format_bytes(static_cast<double>(nbytes)),
          "; budget cap ",
          format_bytes(static_cast<double>(snap.cap)),
          ", allocated ",
          format_bytes(static_cast<double>(snap.allocated)),
          ", reserved ",
          format_bytes(static_cast<double>(snap.reserved)));
    }
    sync_locked();
    return t.ptr;
  }

  void give_back(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    if (pool_.give_back(p) > 0) {
      sync_locked();
      return;
    }
    auto it = host_blocks_.find(p);
    if (it != host_blocks_.end()) {
      s_.host_allocated -= static_cast<int64_t>(it->second);
      host_blocks_.erase(it);
    }
    std::free(p);
  }

  void sync_locked() {
    s_.allocated = pool_.allocated();
    s_.reserved = pool_.reserved();
    s_.peak_allocated = std::max(s_.peak_allocated, s_.allocated);
    s_.peak_reserved = std::max(s_.peak_reserved, s_.reserved);
  }

  void count_release(std::chrono::steady_clock::time_point start) {
    s_.cache_releases += 1;
    s_.cache_release_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
  }

  int64_t release_locked() {
    const auto start = std::chrono::steady_clock::now();
    const int64_t freed = pool_.release();
    if (freed > 0) {
      count_release(start);
      sync_locked();
    }
    return freed;
  }

  static void* raw_alloc(size_t size) {
    void* p = nullptr;
    if (posix_memalign(&p, kAlignment, size) != 0 || p == nullptr) {
      TORCH_CHECK_WITH(
          OutOfMemoryError,
          false,
          "host out of memory: ",
          format_bytes(static_cast<double>(size)));
    }
    return p;
  }

  std::mutex mu_;
  Stats s_;
  BlockPool pool_;
  std::unordered_map<void*, size_t> host_blocks_;
};

class CpuAccountingBackend final : public MemoryBackend {
 public:
  std::string name() const override {
    return "cpu-accounting";
  }
  Stats stats() override {
    return AccountingAllocator::instance().stats();
  }
  void reset_peak() override {
    AccountingAllocator::instance().reset_peak();
  }
  int64_t release_cache() override {
    return AccountingAllocator::instance().release_cache();
  }
  void set_cap(int64_t bytes) override {
    AccountingAllocator::instance().set_cap(bytes);
  }
  std::string write_snapshot(const std::string& /*dir*/) override {
    return "";  // sizes only; nothing a post-mortem would add
  }
};

}  // namespace

MemoryBackend* cpu_accounting_backend() {
  static MemoryBackend* backend = [] {
    c10::SetCPUAllocator(&AccountingAllocator::instance(), /*priority=*/100);
    return new CpuAccountingBackend();  // never freed, as the allocator
  }();
  return backend;
}

DeviceScope::DeviceScope() {
  g_device_depth.fetch_add(1, std::memory_order_relaxed);
}
DeviceScope::~DeviceScope() {
  g_device_depth.fetch_sub(1, std::memory_order_relaxed);
}
HostScope::HostScope() {
  ++t_host_depth;
}
HostScope::~HostScope() {
  --t_host_depth;
}

}  // namespace memtrain::memory
