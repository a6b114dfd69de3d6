#pragma once
// Prefetcher: reads micro-batches ahead on background threads into reusable
// host buffers (page-locked on CUDA), so that the training step does not
// wait on the disk. See Note [Prefetching] in prefetcher.cpp.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "memtrain/input/batch_loader.h"

namespace memtrain {

class Prefetcher {
 public:
  // `depth`: micro-batches read ahead (0: none; load() reads in place).
  // `threads`: background readers (with depth > 0). `pinned`: page-lock
  // the host buffers (Placement::pinned_host_buffers()).
  Prefetcher(
      const SampleSource& source,
      int64_t depth,
      int64_t threads,
      bool pinned = false);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // The micro-batches the next load() calls will ask for, in order. If the
  // queue already starts with exactly these, nothing changes; otherwise
  // what was expected is dropped and these are queued.
  void expect(int64_t epoch, const std::vector<std::vector<int64_t>>& batches);
  // Appends to what is expected (the next window's micro-batches, queued
  // while this window's gradient is being all-reduced).
  void expect_more(
      int64_t epoch, const std::vector<std::vector<int64_t>>& batches);

  // The batch of samples `ids` of `epoch`, in host memory: the queue's
  // front when it is that batch (waiting for it if needed), else read now
  // on this thread (and the queue is dropped: the order has changed, e.g.
  // an out-of-memory replay at another micro-batch). A read error on a
  // background thread is rethrown here.
  Batch load(int64_t epoch, const std::vector<int64_t>& ids);

  // Gives a batch's host buffers back for reuse. `copied` (empty: nothing
  // to wait for) blocks until the copies out of them are done
  // (Placement::copies_done()); it runs before the buffers are read into
  // again, on the thread that reads.
  void recycle(Batch batch, std::function<void()> copied = {});

  // The most its host buffers of micro-batches of `n` hold at once (Note
  // [Host plan]): `depth` read ahead, one in use, a free list of depth + 2,
  // and one a reader may still fill after the queue was dropped, per
  // thread; page-locked buffers rounded up to a power of two, as LibTorch's
  // host caching allocator rounds them. Sets `per_batch` to one batch's
  // bytes and `buffers` to the count.
  int64_t host_bytes_bound(
      int64_t n,
      int64_t* per_batch = nullptr,
      int64_t* buffers = nullptr) const {
    return host_bytes_bound_at(n, depth_, per_batch, buffers);
  }
  // The same at a depth of `depth` (the host plan's choice of one).
  int64_t host_bytes_bound_at(
      int64_t n,
      int64_t depth,
      int64_t* per_batch = nullptr,
      int64_t* buffers = nullptr) const;

  // Micro-batches read ahead.
  int64_t depth() const {
    return depth_;
  }
  // Reads `depth` ahead from now on (data.prefetch=auto: the host plan's
  // choice, once the micro-batch is known): drops what was expected and the
  // free list, and starts the readers the first time it is above 0. On the
  // training thread, between loads.
  void set_depth(int64_t depth);

  // Seconds spent blocked inside load() since the last call.
  double take_wait_seconds();
  // Batches load() had to read itself (not prefetched) since construction.
  int64_t misses() const {
    return misses_;
  }

 private:
  struct Request;
  struct FreeBuffer {
    Batch batch;
    std::function<void()> copied;
  };
  void worker();
  Batch take_buffer(int64_t n);
  void drop_queue_locked();
  void enqueue_locked(
      int64_t epoch, const std::vector<std::vector<int64_t>>& batches);
  // A batch read on the calling thread, into a reused host buffer.
  Batch read_now(int64_t epoch, const std::vector<int64_t>& ids);

  const SampleSource& source_;
  int64_t depth_;  // written by set_depth, between loads
  const int64_t reader_threads_;
  const bool pinned_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<std::shared_ptr<Request>> queue_;
  std::vector<FreeBuffer> free_;  // reusable host buffers
  bool stop_ = false;
  std::vector<std::thread> threads_;
  double wait_s_ = 0.0;
  int64_t misses_ = 0;
};

}  // namespace memtrain
