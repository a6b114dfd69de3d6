#include "memtrain/input/prefetcher.h"

#include <torch/torch.h>

#include <chrono>
#include <exception>

#include "memtrain/memory/device_memory.h"

namespace memtrain {

// Note [Prefetching]
// The trainer knows which samples its rank reads next: at the start of a
// window it expects() the window's micro-batches, and once the window's
// micro-steps are done -- while its gradient is all-reduced and the
// optimizer steps -- it expect_more()s the next window's. Background
// threads read the first `depth` expected batches that nobody has taken
// yet, each into a host buffer from a free list (page-locked for a CUDA
// placement, so the host-to-device copy can be asynchronous). load() takes
// the queue's front, waiting only if it is not read yet: that wait is the
// window's data_wait_s. Anything that changes the order (an out-of-memory
// replay at a smaller micro-batch, a probe) is a miss: load() drops the queue
// and reads in place, and the next expect() starts again. Reads are only ever
// of samples the sampler chose, in the order it chose, so what a rank
// trains on does not depend on thread timing.

struct Prefetcher::Request {
  int64_t epoch = 0;
  std::vector<int64_t> ids;
  bool taken = false;  // a worker is reading it (or has)
  bool done = false;
  Batch batch;
  std::exception_ptr error;
};

Prefetcher::Prefetcher(
    const SampleSource& source, int64_t depth, int64_t threads, bool pinned)
    : source_(source),
      depth_(0),
      reader_threads_(std::max<int64_t>(1, threads)),
      pinned_(pinned) {
  set_depth(depth);
}

void Prefetcher::set_depth(int64_t depth) {
  std::vector<FreeBuffer> stale;
  {
    std::lock_guard<std::mutex> lock(mu_);
    drop_queue_locked();
    depth_ = depth;
    // The free list starts again: it may hold buffers of the sizes the
    // planner's probes read (take_buffer reuses only an exact size) and
    // more than depth + 2 of them, which the host plan does not charge.
    stale.swap(free_);
  }
  for (FreeBuffer& f : stale) {
    if (f.copied)
      f.copied();  // no copy out of a buffer is in flight when it is freed
  }
  work_cv_.notify_all();
  for (int64_t i = static_cast<int64_t>(threads_.size());
       depth > 0 && i < reader_threads_;
       ++i) {
    threads_.emplace_back([this] { worker(); });
  }
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_)
    t.join();
}

int64_t Prefetcher::host_bytes_bound_at(
    int64_t n, int64_t depth, int64_t* per_batch, int64_t* buffers) const {
  Batch one;
  {
    memory::HostScope host;
    one = source_.allocate(1, false);
  }
  int64_t bytes = 0;
  for (const at::Tensor* t : {&one.x, &one.y, &one.context, &one.origin}) {
    if (!t->defined())
      continue;
    int64_t b = static_cast<int64_t>(t->nbytes()) * n;
    if (pinned_) {
      int64_t p = 1;
      while (p < b)
        p *= 2;
      b = p;
    }
    bytes += b;
  }
  const int64_t count = depth > 0 ? 2 * depth + 3 + reader_threads_ : 3;
  if (per_batch != nullptr)
    *per_batch = bytes;
  if (buffers != nullptr)
    *buffers = count;
  return bytes * count;
}

Batch Prefetcher::take_buffer(int64_t n) {
  FreeBuffer f;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].batch.y.size(0) == n) {
        f = std::move(free_[i]);
        free_.erase(free_.begin() + static_cast<int64_t>(i));
        break;
      }
    }
  }
  if (f.batch.y.defined()) {
    if (f.copied)
      f.copied();  // the device's copy out of it is done
    return std::move(f.batch);
  }
  memory::HostScope host;
  return source_.allocate(n, pinned_);
}

void Prefetcher::recycle(Batch batch, std::function<void()> copied) {
  if (!batch.x.defined() || batch.x.use_count() != 1 ||
      batch.y.use_count() != 1) {
    return;  // still referenced elsewhere: not ours to reuse
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<int64_t>(free_.size()) < depth_ + 2)
    free_.push_back({std::move(batch), std::move(copied)});
}

void Prefetcher::worker() {
  memory::HostScope host;  // reader threads allocate host memory only
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    std::shared_ptr<Request> next;
    work_cv_.wait(lock, [&] {
      if (stop_)
        return true;
      const size_t limit = std::min<size_t>(queue_.size(), depth_);
      for (size_t i = 0; i < limit; ++i) {
        if (!queue_[i]->taken) {
          next = queue_[i];
          return true;
        }
      }
      return false;
    });
    if (stop_)
      return;
    next->taken = true;
    lock.unlock();
    try {
      next->batch = read_now(next->epoch, next->ids);
    } catch (...) {
      next->error = std::current_exception();
    }
    lock.lock();
    next->done = true;
    done_cv_.notify_all();
  }
}

void Prefetcher::drop_queue_locked() {
  // Requests being read finish into a request nobody holds any more.
  queue_.clear();
}

void Prefetcher::enqueue_locked(
    int64_t epoch, const std::vector<std::vector<int64_t>>& batches) {
  for (const auto& ids : batches) {
    auto r = std::make_shared<Request>();
    r->epoch = epoch;
    r->ids = ids;
    queue_.push_back(std::move(r));
  }
  work_cv_.notify_all();
}

Batch Prefetcher::read_now(int64_t epoch, const std::vector<int64_t>& ids) {
  Batch b = take_buffer(static_cast<int64_t>(ids.size()));
  memory::HostScope host;
  source_.read(epoch, ids, b);
  return b;
}

void Prefetcher::expect(
    int64_t epoch, const std::vector<std::vector<int64_t>>& batches) {
  if (depth_ == 0)
    return;
  std::lock_guard<std::mutex> lock(mu_);
  bool same = queue_.size() >= batches.size();
  for (size_t i = 0; same && i < batches.size(); ++i) {
    same = queue_[i]->epoch == epoch && queue_[i]->ids == batches[i];
  }
  if (same)
    return;
  drop_queue_locked();
  enqueue_locked(epoch, batches);
}

void Prefetcher::expect_more(
    int64_t epoch, const std::vector<std::vector<int64_t>>& batches) {
  if (depth_ == 0)
    return;
  std::lock_guard<std::mutex> lock(mu_);
  enqueue_locked(epoch, batches);
}

Batch Prefetcher::load(int64_t epoch, const std::vector<int64_t>& ids) {
  const auto start = std::chrono::steady_clock::now();
  std::shared_ptr<Request> r;  // the queue's front, being read by a worker
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!queue_.empty() && queue_.front()->epoch == epoch &&
        queue_.front()->ids == ids) {
      std::shared_ptr<Request> front = queue_.front();
      queue_.pop_front();
      work_cv_.notify_all();  // a slot opened for the next read-ahead
      // Taken: wait for its reader. Not taken yet: no reader got to it,
      // so it is read here below rather than waited for.
      if (front->taken) {
        r = std::move(front);
        done_cv_.wait(lock, [&] { return r->done; });
      }
    } else {
      drop_queue_locked();
    }
  }
  Batch b;
  if (!r) {
    ++misses_;
    b = read_now(epoch, ids);
  }
  wait_s_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (r) {
    if (r->error)
      std::rethrow_exception(r->error);
    b = std::move(r->batch);
  }
  return b;
}

double Prefetcher::take_wait_seconds() {
  const double w = wait_s_;
  wait_s_ = 0.0;
  return w;
}

}  // namespace memtrain
