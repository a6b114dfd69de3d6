#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>

#include "memory_backend.h"
#include "memtrain/compat.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/util/error.h"

namespace memtrain::memory {

// Note [CPU accounting allocator]
// LibTorch lets a program replace its CPU allocator
// (c10::SetCPUAllocator). Ours tags every block with a domain when it is
// allocated: "device" while a DeviceScope is open and the thread is not in a
// HostScope, else "host". Device blocks behave like CUDA's caching
// allocator's: sizes round up to 512 bytes, a freed block goes to a cache
// keyed by size and is reused by the next request of that size, and the cap
// applies to reserved bytes (live + cached). A request that would pass the
// cap releases the cache and tries again, then throws c10::OutOfMemoryError
// -- which unwinds a forward or backward cleanly, freeing the graph.
// oneDNN calls raw_allocate(), which needs the DataPtr's context to be its
// data pointer and a non-null raw_deleter: so per-block sizes live in a side
// table, not in the context.

namespace {

constexpr size_t kAlignment = 64;  // as c10's default CPU allocator
constexpr size_t kRound = 512;     // as CUDA's caching allocator

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
  struct Block {
    size_t size;
    Domain domain;
  };

  static void raw_free(void* p) {
    if (p)
      instance().give_back(p);
  }

  void* take(size_t nbytes) {
    const Domain domain = current_domain();
    const size_t size = (nbytes + kRound - 1) / kRound * kRound;
    std::unique_lock<std::mutex> lock(mu_);
    void* p = nullptr;
    if (domain == Domain::kDevice) {
      auto it = cache_.find(size);
      if (it != cache_.end()) {
        p = it->second;
        cache_.erase(it);
        s_.allocated += size;
      } else {
        const int64_t want = static_cast<int64_t>(size);
        if (s_.cap > 0 && s_.reserved + want > s_.cap) {
          release_locked();  // like CUDA: free cached blocks, then retry
          if (s_.reserved + want > s_.cap) {
            ++s_.num_ooms;
            const Stats snap = s_;
            lock.unlock();
            TORCH_CHECK_WITH(
                OutOfMemoryError,
                false,
                "out of device memory (memtrain CPU accounting): tried to "
                "allocate ",
                format_bytes(static_cast<double>(size)),
                "; budget cap ",
                format_bytes(static_cast<double>(snap.cap)),
                ", allocated ",
                format_bytes(static_cast<double>(snap.allocated)),
                ", reserved ",
                format_bytes(static_cast<double>(snap.reserved)));
          }
        }
        p = raw_alloc(size);
        s_.allocated += want;
        s_.reserved += want;
      }
      s_.peak_allocated = std::max(s_.peak_allocated, s_.allocated);
      s_.peak_reserved = std::max(s_.peak_reserved, s_.reserved);
    } else {
      p = raw_alloc(size);
      s_.host_allocated += static_cast<int64_t>(size);
      s_.host_peak = std::max(s_.host_peak, s_.host_allocated);
    }
    blocks_.emplace(p, Block{size, domain});
    return p;
  }

  void give_back(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(p);
    if (it == blocks_.end()) {
      std::free(p);  // not ours (cannot happen: we hand out our deleter)
      return;
    }
    const Block b = it->second;
    blocks_.erase(it);
    if (b.domain == Domain::kDevice) {
      s_.allocated -= static_cast<int64_t>(b.size);
      cache_.emplace(b.size, p);
    } else {
      s_.host_allocated -= static_cast<int64_t>(b.size);
      std::free(p);
    }
  }

  int64_t release_locked() {
    if (cache_.empty())
      return 0;
    const auto start = std::chrono::steady_clock::now();
    int64_t freed = 0;
    for (auto& [size, p] : cache_) {
      std::free(p);
      freed += static_cast<int64_t>(size);
    }
    cache_.clear();
    s_.reserved -= freed;
    s_.cache_releases += 1;
    s_.cache_release_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
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
  std::unordered_map<void*, Block> blocks_;
  std::multimap<size_t, void*> cache_;
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
