#pragma once
// Communicator: how ranks exchange tensors. One interface, two backends:
// MpiCommunicator (host tensors, any build) and NcclCommunicator (CUDA
// tensors, MEMTRAIN_CUDA builds; its ncclUniqueId travels over MPI), made by
// make_communicator (make_communicator.h). Every collective is counted, so
// tests and metrics can see exactly how many calls and bytes moved. A tensor
// of the other kind of device is staged through a copy (staged_all_reduce).
// No LibTorch or MPI headers here (c10's Device only).

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "memtrain/config/choices.h"
#include "memtrain/util/error.h"

namespace at {
class Tensor;
}

namespace memtrain {

// A collective that failed or timed out on a thread that may not call MPI
// (autograd's device thread, which issues the overlapped gradient buckets):
// the communicator stopped its own work (NCCL: the communicator is aborted)
// and throws this instead of ending the job there. Autograd rethrows it on
// the thread that called backward(), which hands it to
// Communicator::end_job_after() to end the job as a failure on that thread
// would have (the timeout protocol names the ranks that did not arrive).
class CollectiveFailure : public Error {
 public:
  CollectiveFailure(
      const std::string& message,
      const char* collective,
      int64_t sequence,
      bool timed_out)
      : Error(message),
        collective(collective),
        sequence(sequence),
        timed_out(timed_out) {}
  const char* collective;  // "all-reduce", ...
  int64_t sequence;        // its number (MpiWaiter::next_sequence)
  bool timed_out;          // false: an error (NCCL's message in what())
};

struct CommStats {
  int64_t allreduce_calls = 0;
  int64_t allreduce_bytes = 0;  // payload bytes handed to all-reduce
  int64_t broadcast_calls = 0;
  int64_t broadcast_bytes = 0;
  // all_gather_rows (embeddings of a contrastive window): counted here,
  // not in allreduce_*.
  int64_t allgather_calls = 0;
  int64_t allgather_bytes = 0;  // bytes of the gathered tensor
  // all_reduce_batch_norm (model.sync_bn: batch-norm's statistics and
  // their gradients): counted here, not in allreduce_*, so that the
  // gradient's one all-reduce per window stays countable.
  int64_t syncbn_calls = 0;
  int64_t syncbn_bytes = 0;
};

enum class ReduceOp { kSum, kMin, kMax };

// One collective in flight, returned by Communicator::all_reduce_async.
class CollectiveWork {
 public:
  // Destroying a work that was not waited for waits for it first: a
  // collective cannot be cancelled, and until it completes it writes into
  // the caller's tensor.
  virtual ~CollectiveWork();

  // Blocks the calling host thread until the collective is complete, or
  // until dist.timeout_s has passed since this call; then the job ends,
  // naming the ranks that did not arrive (Note [Collective timeouts]).
  // Afterwards the tensor holds the result. MPI: polls the request. NCCL:
  // makes the caller's current CUDA stream wait on the collective's
  // completion event (later work on that stream is ordered after it without
  // a host sync), then polls the event and NCCL's asynchronous error; on an
  // NCCL error or the timeout it aborts the NCCL communicator and ends the
  // job, naming this rank and host. Calling it again returns at once.
  virtual void wait() = 0;
  // Orders the caller's current CUDA stream after the collective, and
  // nothing more (NCCL): the host does not wait, so the collective's
  // completion, NCCL's errors and the timeout are then watched by the
  // caller's next Communicator::wait_for_device() (a window's one host read,
  // Note [One host read per window]). Backends whose results are on the
  // host (MPI, staged copies): wait().
  virtual void wait_on_device() {
    wait();
  }

  // Non-blocking: true once the collective is complete (for NCCL: its
  // completion event has fired; the caller must still wait() to order its
  // stream after it). MPI: also drives MPI's progress, so polling test()
  // between pieces of other work lets the collective advance.
  virtual bool test() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // kMpi or kNccl (never kAuto): what dist.backend resolved to.
  virtual BackendChoice backend() const = 0;

  // Starts reducing `t` element-wise over all ranks with `op`, in place, and
  // returns without waiting for it; the result is in `t` after the work's
  // wait(). Counted in stats() when issued.
  // - Every rank must issue the same collectives in the same order (all
  //   communicator calls, asynchronous or not), each with a tensor of the
  //   same shape and dtype. Several works may be in flight at once and may
  //   be waited for in any order.
  // - The caller keeps `t` alive, and neither reads nor writes it, until
  //   wait() has returned.
  // - `t` must be dense (contiguous in some order of its dimensions, as a
  //   channels-last weight), with the same layout on every rank. MPI: host
  //   tensors, float32/float64/int32/int64; call from the thread that
  //   initialised MPI (CPU autograd runs hooks on the thread that called
  //   backward()). NCCL: CUDA tensors on the communicator's device,
  //   float32/float64/float16/bfloat16/int32/int64; the collective runs on the
  //   communicator's own stream, after the work already queued on the caller's
  //   current stream (an event, no host sync), so `t` may be the output of
  //   kernels still in flight.
  virtual std::unique_ptr<CollectiveWork> all_reduce_async(
      at::Tensor& t, ReduceOp op) = 0;

  // all_reduce_async(t, op)->wait(): collective, blocking.
  void all_reduce(at::Tensor& t, ReduceOp op) {
    all_reduce_async(t, op)->wait();
  }

  void all_reduce_sum(at::Tensor& t) {
    all_reduce(t, ReduceOp::kSum);
  }
  // Collective, blocking: every rank's `mine` (rows of one trailing shape,
  // same dtype on every rank) placed at rows [offset, offset + rows) of a
  // (total, ...) tensor on mine's device, which every rank gets. The
  // ranks' row ranges must not overlap; rows nobody wrote are zero. Done
  // as one sum of zero-padded tensors (exact: x + 0 = x), so every backend
  // and device that all-reduces can gather; counted as an all-gather.
  at::Tensor all_gather_rows(
      const at::Tensor& mine, int64_t offset, int64_t total);

  // Collective, blocking: all_reduce_sum(t) of batch-norm's statistics
  // (model.sync_bn), counted as syncbn_*, not allreduce_*. Sync
  // batch-norm calls it from forward and backward, on the training thread
  // on a CPU (see Note [Batch-norm and data parallelism]). Blocking, so
  // that a rank may read the count it summed (sync_batch_norm.cpp) and a
  // dead peer is watched for (NCCL: each is a counted host sync).
  void all_reduce_batch_norm(at::Tensor& t);

  // Collective, blocking: copies `t` from rank `root` to every rank, in
  // place. Same rules as all_reduce_async; returns when done, as wait().
  virtual void broadcast(at::Tensor& t, int root) = 0;

  // Collective, blocking (within dist.timeout_s): returns once every rank
  // has called it. NCCL: also waits for this rank's current stream.
  virtual void barrier() = 0;

  // Whether a large float32 sum started with all_reduce_async runs while
  // the caller goes on (true), or is complete when all_reduce_async returns
  // (false: MPI's shared-memory path, Note [Shared-memory all-reduce]);
  // starting buckets inside backward then only adds synchronisation points.
  virtual bool all_reduce_overlaps() const {
    return true;
  }

  // Blocks until `done()` (a device event this rank queued after its
  // collectives: a read's copy) is true, watching what wait() watches:
  // NCCL polls `done` together with NCCL's asynchronous error and
  // dist.timeout_s, and ends the job on either as wait() does, naming the
  // last collective issued (the one a dead peer would hold; the timeout
  // protocol matches ranks by its sequence number). Other backends: their
  // collectives were waited for on the host already, so this only polls
  // `done`.
  virtual void wait_for_device(const std::function<bool()>& done);
  // Ends the job after `failure` came out of a thread that may not call MPI
  // (see CollectiveFailure), from the thread that initialised MPI. Backends
  // that never throw it return and leave the ending to the caller.
  virtual void end_job_after(const CollectiveFailure& failure) {
    (void)failure;
  }

  const CommStats& stats() const {
    return stats_;
  }

 protected:
  CommStats stats_;

 private:
  // all_reduce_sum(t) counted in `calls` and `bytes` instead of
  // allreduce_* (all_gather_rows, all_reduce_batch_norm).
  void sum_counted_as(at::Tensor& t, int64_t& calls, int64_t& bytes);
};

// For backends, on a tensor of the other kind of device than theirs (a host
// tensor given to NCCL, a GPU tensor given to MPI): reduces (broadcasts) a
// copy on `device` and copies the result back into `t` -- at the work's
// wait() for the asynchronous form. The small control collectives of a
// run (agreements, totals, checks) are host tensors whatever the backend.
std::unique_ptr<CollectiveWork> staged_all_reduce(
    Communicator& comm, at::Tensor& t, ReduceOp op, const c10::Device& device);
void staged_broadcast(
    Communicator& comm, at::Tensor& t, int root, const c10::Device& device);

// Collective: true on every rank iff `ok` is true on every rank. For
// agreeing on a check before anyone proceeds, so no rank is left waiting in a
// collective its peers skipped. Not counted as a gradient exchange.
bool all_ranks_ok(Communicator& comm, bool ok);

}  // namespace memtrain
