#include "memtrain/memory/host_pool.h"

#include <ATen/Functions.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

#include "memtrain/memory/device_memory.h"
#include "offload_mover.h"

namespace memtrain::memory {

// Note [Host offload]
// Under full checkpointing, what stays alive in device memory from a
// segment's forward to its backward is the segment's inputs (Note
// [Checkpointing]). The offload tier (Recompute::kAllOffload) moves them
// out: checkpoint() hands them to the host pool before running the
// segment, keeps only the pool's group, and its backward takes them back.
//
// - Copies. CUDA: on a copy stream of the device's, after an event recorded
//   on the compute stream (the input is complete); the input's block is
//   recorded on the copy stream, so the caching allocator does not reuse
//   it before the copy has read it; the host never waits. Coming back, the
//   device tensor is allocated on the compute stream (one pool for the
//   whole loop, as the budget measures it), the copy stream waits for that
//   point, copies and records an event, and the compute stream waits for
//   the event. CPU: memcpy, out of the accounting allocator's device
//   domain into host-domain blocks, so that the device peak and the pool's
//   bytes are what a GPU would hold, measured exactly here.
// - One segment ahead. Groups are numbered in forward order. When a
//   checkpoint's backward is done (recomputation and inner backward), the
//   closest earlier group that is still waiting starts coming back:
//   backward runs the segments in reverse, so that is the next one needed.
//   Not earlier: brought back while this segment's recomputation is alive,
//   it would add to the very peak offload lowers (measured on the CPU: the
//   U-Net's offload peak was above full checkpointing's at 32^3 with the
//   prefetch at the start of the backward). On CUDA the copy therefore
//   starts when this segment's kernels are done and the next segment's
//   recomputation waits for it: its time, the inputs' bytes over the host
//   link, is exposed (compiled, not run on a GPU). A group whose turn
//   comes out of that order is copied when it is taken: the order is a
//   guess for speed, never for correctness.
// - Shared inputs. A tensor that two checkpoints save (a U-Net encoder
//   output: the next encoder block's input and a decoder block's skip) is
//   copied out once; each group brings it back when it needs it, and its
//   block is free when the last group is done with it.
// - Blocks. Sizes round up to 512 bytes; a freed block goes to a free list
//   and the next request takes the smallest free block that holds it, so a
//   micro-step that offloads the same shapes as the last reuses its blocks
//   exactly and the pool does not grow (stats().grows). A new block that
//   would pass memory.host_budget first frees the free blocks (a probe's
//   smaller ones), then throws HostBudgetExceeded. CUDA blocks are
//   page-locked (cudaHostAlloc: the only host-blocking call, made when the
//   pool grows); every copy that touches a block runs on the one copy
//   stream, so a block reused while an earlier copy from it is in flight
//   is written after that copy, in stream order. trim() waits for the
//   copy stream before it frees blocks.
// - Exactness. Bytes are copied as they are, with the tensor's sizes,
//   strides and dtype: the recomputation sees bit for bit what full
//   checkpointing saves, so the gradients are the same (tests). An input
//   changed in place after it was offloaded (which SavedVariable refuses
//   for the tiers without offload) is refused when it comes back if the
//   tensor is still alive then; on CUDA a change made while its copy is
//   still running would not be seen. memtrain's segments never change
//   their inputs in place (the tiers without offload would refuse it).

namespace {

constexpr int64_t kRound = 512;  // as the caching allocators

using WeakImpl =
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

}  // namespace

// The blocks of one device's mover.
struct Slot {
  c10::Device device;
  std::unique_ptr<OffloadMover> mover;
  std::multimap<int64_t, at::Tensor> free;  // size -> block
};

// One offloaded tensor.
struct Entry {
  std::shared_ptr<HostPool::Impl> pool;
  Slot* slot = nullptr;
  at::Tensor block;  // uint8, `size` bytes; undefined for an empty tensor
  int64_t size = 0;
  int64_t bytes = 0;  // of the tensor; in use: round_up(bytes)
  std::vector<int64_t> sizes, strides;
  at::TensorOptions options;
  std::optional<WeakImpl> source;  // the tensor offloaded: in-place check
  int64_t version = 0;
  ~Entry();
};

struct OffloadGroup::State {
  std::shared_ptr<HostPool::Impl> pool;
  uint64_t seq = 0;
  std::vector<std::shared_ptr<Entry>> entries;
  // Brought back ahead of take() (prefetch): the tensors and their copies.
  std::vector<at::Tensor> restored;
  std::vector<std::shared_ptr<void>> copied;
  bool restoring = false;
  bool taken = false;
};

struct HostPool::Impl {
  explicit Impl(int64_t budget) {
    s.budget = budget;
  }
  ~Impl() {
    for (auto& slot : slots) {
      try {
        slot->mover->synchronize();  // no copy still uses a block freed now
      } catch (const std::exception& e) {
        std::fprintf(
            stderr, "memtrain: host offload pool at exit: %s\n", e.what());
      }
    }
  }

  Slot& slot_for(const c10::Device& device) {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& slot : slots) {
      if (slot->device == device)
        return *slot;
    }
    std::unique_ptr<OffloadMover> mover;
    if (device.is_cpu()) {
      mover = make_cpu_mover();
    } else {
      MT_CHECK(
          device.is_cuda(),
          "host offload: tensors on ",
          device.str(),
          " cannot be offloaded (CPU and CUDA can)");
      mover = make_cuda_mover(device);
    }
    slots.push_back(std::make_unique<Slot>(Slot{device, std::move(mover), {}}));
    return *slots.back();
  }

  // A block of at least `bytes` for `slot`: a free one, else a new one
  // within the budget -- after freeing the free blocks when a new one
  // would pass it (a probe's smaller blocks), as a caching allocator
  // does. Returns the block and its size; `bytes` rounded up count as in
  // use (until give_back).
  std::pair<at::Tensor, int64_t> acquire(
      Slot& slot, int64_t bytes, const at::Tensor& x) {
    const int64_t want = round_up(bytes);
    std::vector<at::Tensor> released;  // freed after the lock
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = slot.free.lower_bound(want);
      if (it != slot.free.end()) {
        std::pair<at::Tensor, int64_t> got{std::move(it->second), it->first};
        slot.free.erase(it);
        use(want);
        return got;
      }
      if (s.budget > 0 && s.reserved + want > s.budget)
        release_free_locked(released);
      if (s.budget > 0 && s.reserved + want > s.budget) {
        throw HostBudgetExceeded(detail::concat(
            "host offload: a ",
            format_bytes(static_cast<double>(want)),
            " activation (shape ",
            x.sizes(),
            ") does not fit the offload pool's cap (",
            format_bytes(static_cast<double>(s.budget)),
            ": what memory.host_budget leaves after the host plan's other "
            "holders), which holds ",
            format_bytes(static_cast<double>(s.reserved)),
            " of offloaded activations already; raise memory.host_budget "
            "(a size such as 32GiB), lower the micro-batch, or use "
            "training.gradient_checkpointing=all (no offload)"));
      }
      // Counted before the block exists, so that two threads cannot both
      // pass the budget check; undone if the allocation fails.
      s.reserved += want;
    }
    at::Tensor block;
    try {
      block = slot.mover->new_block(want);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      s.reserved -= want;
      throw;
    }
    std::lock_guard<std::mutex> lock(mu);
    s.grows += 1;
    use(want);
    return {std::move(block), want};
  }

  void give_back(Slot& slot, at::Tensor block, int64_t size, int64_t used) {
    std::lock_guard<std::mutex> lock(mu);
    s.in_use -= used;
    slot.free.emplace(size, std::move(block));
  }

  // Moves every free block into `out` (to be freed once `mu` is let go),
  // after waiting for the copies that may still use them; returns their
  // bytes. Under mu.
  int64_t release_free_locked(std::vector<at::Tensor>& out) {
    int64_t bytes = 0;
    for (auto& slot : slots) {
      if (slot->free.empty())
        continue;
      slot->mover->synchronize();
      for (auto& [size, block] : slot->free) {
        bytes += size;
        out.push_back(std::move(block));
      }
      slot->free.clear();
    }
    s.reserved -= bytes;
    return bytes;
  }

  static int64_t round_up(int64_t bytes) {
    return (bytes + kRound - 1) / kRound * kRound;
  }

  // The offloaded copy of `x` that a live group holds, if any.
  std::shared_ptr<Entry> shared_entry(const at::Tensor& x) {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = shared.begin(); it != shared.end();) {
      it = it->second.expired() ? shared.erase(it) : std::next(it);
    }
    auto it = shared.find(x.unsafeGetTensorImpl());
    if (it == shared.end())
      return nullptr;
    std::shared_ptr<Entry> e = it->second.lock();
    if (e && e->version == x._version() &&
        e->source->lock().get() == x.unsafeGetTensorImpl())
      return e;
    return nullptr;
  }

  void share(const at::Tensor& x, const std::shared_ptr<Entry>& e) {
    std::lock_guard<std::mutex> lock(mu);
    shared[x.unsafeGetTensorImpl()] = e;
  }

  void use(int64_t size) {  // under mu
    s.in_use += size;
    s.peak_in_use = std::max(s.peak_in_use, s.in_use);
  }

  mutable std::mutex mu;
  HostPoolStats s;
  std::vector<std::unique_ptr<Slot>> slots;
  std::unordered_map<const c10::TensorImpl*, std::weak_ptr<Entry>> shared;
  // Live groups in forward order (Note [Host offload]: one segment ahead).
  std::map<uint64_t, std::weak_ptr<OffloadGroup::State>> order;
  uint64_t next_seq = 0;
};

Entry::~Entry() {
  if (block.defined())
    pool->give_back(
        *slot, std::move(block), size, HostPool::Impl::round_up(bytes));
}

namespace {

// Starts bringing `g`'s tensors back (each a new device tensor).
void restore(OffloadGroup::State& g) {
  g.restoring = true;
  for (const std::shared_ptr<Entry>& e : g.entries) {
    const c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> src =
        e->source->lock();
    MT_CHECK(
        !src || src->version_counter().current_version() == e->version,
        "host offload: a checkpointed segment's input of shape ",
        c10::IntArrayRef(e->sizes),
        " was modified in place after the forward saved it; the backward "
        "would see other values than the forward did");
    if (src) {
      // Something else kept the tensor alive (a U-Net block's shortcut
      // saves its input): it is still in device memory, unchanged, so it
      // is used as it is -- a copy would hold it twice.
      g.restored.push_back(at::Tensor(src).detach());
      g.copied.push_back(nullptr);
      std::lock_guard<std::mutex> lock(e->pool->mu);
      e->pool->s.still_on_device += 1;
      continue;
    }
    std::shared_ptr<void> copied;
    at::Tensor out = e->bytes > 0
                         ? e->slot->mover->copy_in(
                               e->block.data_ptr(),
                               e->bytes,
                               e->sizes,
                               e->strides,
                               e->options,
                               &copied)
                         : at::empty_strided(e->sizes, e->strides, e->options);
    g.restored.push_back(std::move(out));
    g.copied.push_back(std::move(copied));
    std::lock_guard<std::mutex> lock(e->pool->mu);
    e->pool->s.copied_in += e->bytes;
  }
}

}  // namespace

HostPool::HostPool(int64_t budget_bytes)
    : impl_(std::make_shared<Impl>(budget_bytes)) {}

HostPool::~HostPool() = default;

std::shared_ptr<OffloadGroup> HostPool::offload(
    const std::vector<at::Tensor>& xs) {
  auto g = std::make_shared<OffloadGroup::State>();
  g->pool = impl_;
  for (const at::Tensor& x : xs) {
    MT_INTERNAL_ASSERT(x.defined(), "host offload of an undefined tensor");
    std::shared_ptr<Entry> e = impl_->shared_entry(x);
    if (!e) {
      const at::Tensor dense =
          x.is_non_overlapping_and_dense() ? x : x.contiguous();
      e = std::make_shared<Entry>();
      e->pool = impl_;
      e->slot = &impl_->slot_for(x.device());
      e->bytes = dense.numel() * static_cast<int64_t>(dense.element_size());
      e->sizes = dense.sizes().vec();
      e->strides = dense.strides().vec();
      e->options = dense.options();
      e->source = WeakImpl(x.getIntrusivePtr());
      e->version = x._version();
      if (e->bytes > 0) {
        std::tie(e->block, e->size) = impl_->acquire(*e->slot, e->bytes, x);
        e->slot->mover->copy_out(dense, e->block.data_ptr(), e->bytes);
        std::lock_guard<std::mutex> lock(impl_->mu);
        impl_->s.copied_out += e->bytes;
      }
      impl_->share(x, e);
    }
    g->entries.push_back(std::move(e));
  }
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    g->seq = impl_->next_seq++;
    impl_->order[g->seq] = g;
  }
  return std::make_shared<OffloadGroup>(std::move(g));
}

HostPoolStats HostPool::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->s;
}

void HostPool::reset_peak() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->s.peak_in_use = impl_->s.in_use;
  impl_->s.copied_out = 0;
  impl_->s.copied_in = 0;
}

int64_t HostPool::trim() {
  std::vector<at::Tensor> freed;  // freed on return, outside the lock
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->release_free_locked(freed);
}

OffloadGroup::OffloadGroup(std::shared_ptr<State> state)
    : state_(std::move(state)) {}

void OffloadGroup::prefetch_ahead() {
  State& g = *state_;
  // The closest earlier group still waiting.
  std::shared_ptr<State> ahead;
  {
    std::lock_guard<std::mutex> lock(g.pool->mu);
    auto it = g.pool->order.lower_bound(g.seq);
    while (it != g.pool->order.begin()) {
      --it;
      ahead = it->second.lock();
      if (ahead && !ahead->taken)
        break;
      ahead.reset();
    }
  }
  if (ahead && !ahead->restoring)
    restore(*ahead);
}

OffloadGroup::~OffloadGroup() {
  std::lock_guard<std::mutex> lock(state_->pool->mu);
  state_->pool->order.erase(state_->seq);
}

std::vector<at::Tensor> OffloadGroup::take() {
  State& g = *state_;
  MT_INTERNAL_ASSERT(!g.taken, "an offloaded group taken twice");
  g.taken = true;
  if (!g.restoring)
    restore(g);
  for (size_t i = 0; i < g.copied.size(); ++i) {
    if (g.copied[i])
      g.entries[i]->slot->mover->ready(g.copied[i]);
  }
  std::vector<at::Tensor> out = std::move(g.restored);
  g.restored.clear();
  g.copied.clear();
  g.entries.clear();  // the last group of an entry frees its block
  return out;
}

namespace {
std::mutex g_pool_mu;
std::shared_ptr<HostPool> g_pool;
}  // namespace

std::shared_ptr<HostPool> offload_pool() {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  return g_pool;
}

void set_offload_pool(std::shared_ptr<HostPool> pool) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  g_pool = std::move(pool);
}

namespace {

// Note [Host offload], on the CPU.
class CpuMover final : public OffloadMover {
 public:
  at::Tensor new_block(int64_t bytes) override {
    HostScope host;
    return at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
  }
  void copy_out(const at::Tensor& x, void* host, int64_t bytes) override {
    std::memcpy(host, x.data_ptr(), static_cast<size_t>(bytes));
  }
  at::Tensor copy_in(
      const void* host,
      int64_t bytes,
      c10::IntArrayRef sizes,
      c10::IntArrayRef strides,
      const at::TensorOptions& options,
      std::shared_ptr<void>* copied) override {
    at::Tensor out = at::empty_strided(sizes, strides, options);
    std::memcpy(out.data_ptr(), host, static_cast<size_t>(bytes));
    copied->reset();
    return out;
  }
  void ready(const std::shared_ptr<void>& /*copied*/) override {}
  void synchronize() override {}
};

}  // namespace

std::unique_ptr<OffloadMover> make_cpu_mover() {
  return std::make_unique<CpuMover>();
}

#if !MEMTRAIN_CUDA
std::unique_ptr<OffloadMover> make_cuda_mover(c10::Device device) {
  throw Error(detail::concat(
      "host offload: ",
      device.str(),
      " tensors on a build without CUDA (rebuild with "
      "launch/build.sh -DMEMTRAIN_CUDA=ON)"));
}
#endif

}  // namespace memtrain::memory
