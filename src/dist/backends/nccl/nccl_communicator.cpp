// Built only with MEMTRAIN_CUDA=ON, against the torch wheels' LibTorch and
// NCCL; not run on a GPU yet.
#include "memtrain/dist/nccl_communicator.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "memtrain/device/host_sync.h"
#include "memtrain/dist/mpi_wait.h"
#include "memtrain/util/clock.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

#define MT_NCCL_CHECK(call, rank)                           \
  do {                                                      \
    const ncclResult_t mt_rc = (call);                      \
    if (mt_rc != ncclSuccess) {                             \
      ::memtrain::throw_library_error(                      \
          (rank),                                           \
          #call,                                            \
          __FILE__,                                         \
          __LINE__,                                         \
          std::string(ncclGetErrorString(mt_rc)) +          \
              " (set NCCL_DEBUG=INFO for NCCL's reasons)"); \
    }                                                       \
  } while (0)

#define MT_CUDA_CHECK(call, rank)                                        \
  do {                                                                   \
    const cudaError_t mt_rc = (call);                                    \
    if (mt_rc != cudaSuccess) {                                          \
      ::memtrain::throw_library_error(                                   \
          (rank), #call, __FILE__, __LINE__, cudaGetErrorString(mt_rc)); \
    }                                                                    \
  } while (0)

ncclDataType_t nccl_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    default:
      throw InternalError(
          std::string("NcclCommunicator: unsupported dtype ") +
          c10::toString(t.scalar_type()));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

// One rank's GPU, gathered over MPI before NCCL starts. Plain bytes.
struct DeviceRecord {
  int ok = 0;  // 0: this rank could not select or query its device
  int device = -1;
  int pci_domain = 0;
  int pci_bus = 0;
  int pci_device = 0;
  char uuid[16] = {0};
  char host[64] = {0};
};

std::string pci_name(const DeviceRecord& d) {
  char buf[32];
  std::snprintf(
      buf,
      sizeof(buf),
      "%04x:%02x:%02x.0",
      d.pci_domain,
      d.pci_bus,
      d.pci_device);
  return buf;
}

}  // namespace

struct NcclCommunicator::Impl {
  // The MPI side: the start's exchanges, barrier(), the numbering of
  // collectives and the timeout protocol of Note [Collective timeouts].
  MpiWaiter waiter;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;  // the communication stream
  cudaEvent_t ready = nullptr;    // reused: "the caller's stream got here"
  int rank = 0;
  int size = 1;
  int device = 0;
  // The last collective launched, for wait_for_device()'s messages.
  const char* last_what = "collective";
  int64_t last_seq = 0;
  // The thread that built the communicator: the only one that may call MPI
  // (FUNNELED). Autograd's device thread issues overlapped buckets.
  const std::thread::id mpi_thread = std::this_thread::get_id();

  Impl(MPI_Comm mpi, int dev, double timeout_s)
      : waiter(mpi, timeout_s), device(dev) {}

  bool on_mpi_thread() const {
    return std::this_thread::get_id() == mpi_thread;
  }

  ~Impl() {
    if (comm)
      finalize();
    if (ready)
      cudaEventDestroy(ready);
    if (stream)
      cudaStreamDestroy(stream);
  }

  // NCCL's state of the communicator: ncclSuccess, ncclInProgress (a
  // non-blocking call is still being processed), or an error.
  ncclResult_t state() const {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm, &async);
    return rc != ncclSuccess ? rc : async;
  }

  void abort_comm() {
    if (comm) {
      ncclCommAbort(comm);
      comm = nullptr;
    }
  }

  // "[rank 1, node7] NCCL all-reduce #12": a collective, in messages.
  std::string named(const char* what, int64_t seq) const {
    return detail::concat(
        "[rank ", rank, ", ", host_name(), "] NCCL ", what, " #", seq);
  }

  // "... NCCL all-reduce #12 failed: ... " with NCCL's reasons.
  std::string failure_text(ncclResult_t rc, const char* what, int64_t seq) {
    const std::string last = comm ? ncclGetLastError(comm) : "";
    return detail::concat(
        named(what, seq),
        " failed: ",
        ncclGetErrorString(rc),
        last.empty() ? "" : ": ",
        last,
        ". A peer rank probably died or lost its network (NCCL_DEBUG=INFO "
        "shows NCCL's view). Aborting the job; if a checkpoint was written, "
        "continue with --resume auto.");
  }

  [[noreturn]] void end_job(const std::string& message) {
    std::fprintf(stderr, "memtrain: error: %s\n", message.c_str());
    std::fflush(stderr);
    MPI_Abort(waiter.comm(), kExitFailure);
    std::_Exit(kExitFailure);
  }

  // An NCCL error ends the job: peers may be inside this collective, and an
  // aborted communicator cannot be used again. Off the MPI thread the
  // communicator is aborted and CollectiveFailure thrown instead.
  [[noreturn]] void failed(ncclResult_t rc, const char* what, int64_t seq) {
    const std::string message = failure_text(rc, what, seq);
    abort_comm();
    if (!on_mpi_thread())
      throw CollectiveFailure(message, what, seq, /*timed_out=*/false);
    end_job(message);
  }

  // True once `event` has fired. A CUDA error other than "not ready" (a
  // sticky error from any kernel) throws.
  bool event_done(cudaEvent_t event) const {
    const cudaError_t rc = cudaEventQuery(event);
    if (rc == cudaErrorNotReady)
      return false;
    MT_CUDA_CHECK(rc, rank);
    return true;
  }

  // Blocks until `ready()` is true, polling NCCL's asynchronous error along
  // with it: an error ends the job (failed()), and so does the timeout,
  // counted from this call, after aborting the NCCL communicator (so its
  // kernels stop spinning) through the protocol of Note [Collective
  // timeouts], which names the ranks that did not arrive.
  template <typename Ready>
  void poll(Ready&& ready, const char* what, int64_t seq) {
    // A bounded polling rate, not a spinning core per rank: the first
    // polls back to back (a short collective), then sleeps that double
    // from 10 us to 1 ms, so a long one costs at most ~1000 polls a second.
    const auto start = std::chrono::steady_clock::now();
    std::chrono::microseconds nap(10);
    for (int polls = 0;; ++polls) {
      const ncclResult_t s = state();
      if (s != ncclSuccess && s != ncclInProgress)
        failed(s, what, seq);
      if (ready(s))
        return;
      if (polls >= 64) {
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, std::chrono::microseconds(1000));
      }
      if (waiter.timeout_s() > 0 && seconds_since(start) > waiter.timeout_s()) {
        abort_comm();
        if (!on_mpi_thread()) {
          throw CollectiveFailure(
              detail::concat(
                  named(what, seq),
                  " did not complete within dist.timeout_s=",
                  waiter.timeout_s(),
                  " s"),
              what,
              seq,
              /*timed_out=*/true);
        }
        waiter.timed_out(what, seq);
      }
    }
  }

  // A non-blocking communicator may answer any call with ncclInProgress
  // before the work is enqueued; nothing else may be called on it until
  // its state is ncclSuccess again.
  void settle(ncclResult_t rc, const char* what, int64_t seq) {
    if (rc == ncclInProgress) {
      poll([](ncclResult_t s) { return s == ncclSuccess; }, what, seq);
    } else if (rc != ncclSuccess) {
      failed(rc, what, seq);
    }
  }

  // Dense in any order of dimensions, as MpiCommunicator's check_tensor.
  void check(const at::Tensor& t) const {
    MT_INTERNAL_ASSERT(
        t.defined() && t.is_cuda() && t.is_non_overlapping_and_dense() &&
            t.device().index() == device,
        "NcclCommunicator needs a dense tensor on cuda:",
        device);
  }

  class Work final : public CollectiveWork {
   public:
    Work(Impl& m, cudaEvent_t done, const char* what, int64_t seq)
        : m_(m), done_(done), what_(what), seq_(seq) {}

    ~Work() override {
      if (!waited_) {
        try {
          wait();
        } catch (const std::exception& e) {
          std::fprintf(stderr, "memtrain: error: %s\n", e.what());
        }
      }
      cudaEventDestroy(done_);
    }

    void wait() override {
      if (waited_)
        return;
      waited_ = true;       // if it throws, the destructor does not try again
      const HostSync sync;  // the host waits for the device
      const c10::cuda::CUDAGuard guard(m_.device);
      // Later work on the caller's stream runs after the collective, with
      // no host sync; the host then polls for the timeout and for NCCL's
      // errors, which a stream cannot.
      MT_CUDA_CHECK(
          cudaStreamWaitEvent(
              c10::cuda::getCurrentCUDAStream(m_.device).stream(), done_, 0),
          m_.rank);
      m_.poll(
          [this](ncclResult_t) { return m_.event_done(done_); }, what_, seq_);
    }

    void wait_on_device() override {
      if (waited_)
        return;
      waited_ = true;  // the destructor does not wait on the host
      const c10::cuda::CUDAGuard guard(m_.device);
      MT_CUDA_CHECK(
          cudaStreamWaitEvent(
              c10::cuda::getCurrentCUDAStream(m_.device).stream(), done_, 0),
          m_.rank);
    }

    bool test() override {
      const ncclResult_t s = m_.state();
      if (s != ncclSuccess && s != ncclInProgress)
        m_.failed(s, what_, seq_);
      return m_.event_done(done_);
    }

   private:
    Impl& m_;
    cudaEvent_t done_;
    const char* what_;
    int64_t seq_;
    bool waited_ = false;
  };

  // Orders the communication stream after the caller's current stream,
  // enqueues one collective there with `enqueue(stream)`, and records its
  // completion event.
  template <typename Enqueue>
  std::unique_ptr<Work> launch(
      const at::Tensor& t, const char* what, Enqueue&& enqueue) {
    check(t);
    MT_INTERNAL_ASSERT(comm != nullptr, "the NCCL communicator was aborted");
    const c10::cuda::CUDAGuard guard(device);
    const int64_t seq = waiter.next_sequence();
    last_what = what;
    last_seq = seq;
    const cudaStream_t current =
        c10::cuda::getCurrentCUDAStream(device).stream();
    MT_CUDA_CHECK(cudaEventRecord(ready, current), rank);
    MT_CUDA_CHECK(cudaStreamWaitEvent(stream, ready, 0), rank);
    settle(enqueue(stream), what, seq);
    // The caching allocator must not hand t's block to other work before
    // the collective has finished with it, even if the caller frees t
    // first (a staged copy, a bucket replaced after an out-of-memory
    // replay): record its use on the communication stream.
    c10::cuda::CUDACachingAllocator::recordStream(
        t.storage().data_ptr(),
        c10::cuda::getStreamFromExternal(
            stream, static_cast<c10::DeviceIndex>(device)));
    cudaEvent_t done = nullptr;
    MT_CUDA_CHECK(
        cudaEventCreateWithFlags(&done, cudaEventDisableTiming), rank);
    const cudaError_t rc = cudaEventRecord(done, stream);
    if (rc != cudaSuccess)
      cudaEventDestroy(done);
    MT_CUDA_CHECK(rc, rank);
    return std::make_unique<Work>(*this, done, what, seq);
  }

  // Collective: every rank's GPU; two ranks on one GPU are refused.
  void check_devices() {
    DeviceRecord mine;
    std::string error;
    const cudaError_t set = cudaSetDevice(device);
    cudaDeviceProp prop;
    const cudaError_t got =
        set == cudaSuccess ? cudaGetDeviceProperties(&prop, device) : set;
    if (got == cudaSuccess) {
      mine.ok = 1;
      mine.device = device;
      mine.pci_domain = prop.pciDomainID;
      mine.pci_bus = prop.pciBusID;
      mine.pci_device = prop.pciDeviceID;
      std::memcpy(mine.uuid, prop.uuid.bytes, sizeof(mine.uuid));
    } else {
      error = detail::concat(
          "[rank ",
          rank,
          ", ",
          host_name(),
          "] cannot use CUDA device ",
          device,
          ": ",
          cudaGetErrorString(got),
          " (is the device index below the GPUs this rank sees? check "
          "CUDA_VISIBLE_DEVICES and the ranks per node)");
    }
    std::strncpy(mine.host, host_name().c_str(), sizeof(mine.host) - 1);
    std::vector<DeviceRecord> all(static_cast<size_t>(size));
    MPI_Request request;
    MT_MPI_CHECK(
        MPI_Iallgather(
            &mine,
            sizeof(DeviceRecord),
            MPI_BYTE,
            all.data(),
            sizeof(DeviceRecord),
            MPI_BYTE,
            waiter.comm(),
            &request),
        rank);
    waiter.wait(&request, 1, "GPU table (NCCL start)", waiter.next_sequence());
    if (!error.empty())
      throw Error(error);
    for (const DeviceRecord& d : all) {
      if (!d.ok)
        throw PeerError("another rank cannot use its CUDA device");
    }
    for (int i = 0; i < size; ++i) {
      for (int j = i + 1; j < size; ++j) {
        const DeviceRecord& a = all[static_cast<size_t>(i)];
        const DeviceRecord& b = all[static_cast<size_t>(j)];
        // One GPU seen from two hosts is two "nodes" of one machine
        // (network namespaces, NCCL_HOSTID): NCCL treats them as hosts.
        MT_CHECK(
            std::strncmp(a.host, b.host, sizeof(a.host)) != 0 ||
                std::memcmp(a.uuid, b.uuid, sizeof(a.uuid)) != 0,
            "NCCL refuses two ranks on one GPU: use dist.backend=mpi, or one "
            "rank per GPU (ranks ",
            i,
            " and ",
            j,
            " both use GPU ",
            pci_name(a),
            " on host ",
            a.host,
            ")");
      }
    }
  }

  // Collective: rank 0 makes the ncclUniqueId and broadcasts it over MPI.
  ncclUniqueId unique_id() {
    struct {
      int ok = 0;
      ncclUniqueId id;
    } msg;
    std::memset(&msg.id, 0, sizeof(msg.id));
    std::string error;
    if (rank == 0) {
      try {
        MT_NCCL_CHECK(ncclGetUniqueId(&msg.id), rank);
        msg.ok = 1;
      } catch (const Error& e) {
        error = e.what();
      }
    }
    MPI_Request request;
    MT_MPI_CHECK(
        MPI_Ibcast(&msg, sizeof(msg), MPI_BYTE, 0, waiter.comm(), &request),
        rank);
    waiter.wait(&request, 1, "ncclUniqueId broadcast", waiter.next_sequence());
    if (!error.empty())
      throw Error(error);
    if (!msg.ok)
      throw PeerError("rank 0 could not make the ncclUniqueId");
    return msg.id;
  }

  // Flushes and frees the communicator together with the peers. A
  // destructor must not end the job: an error or the timeout aborts the
  // communicator (local) instead.
  void finalize() {
    const auto start = std::chrono::steady_clock::now();
    ncclResult_t s = ncclCommFinalize(comm);
    while (s == ncclInProgress) {
      if (waiter.timeout_s() > 0 && seconds_since(start) > waiter.timeout_s())
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      s = state();
    }
    if (s == ncclSuccess) {
      ncclCommDestroy(comm);
      comm = nullptr;
    } else {
      abort_comm();
    }
  }
};

NcclCommunicator::NcclCommunicator(MPI_Comm comm, int device, double timeout_s)
    : impl_(std::make_unique<Impl>(comm, device, timeout_s)) {
  Impl& m = *impl_;
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm, &m.rank);
  MPI_Comm_size(comm, &m.size);
  // 1. Every rank's GPU, agreed over MPI before NCCL could hang on it.
  m.check_devices();
  // 2. The id, from rank 0.
  const ncclUniqueId id = m.unique_id();
  // 3. A non-blocking start, polled against the timeout.
  const int64_t seq = m.waiter.next_sequence();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t rc =
      ncclCommInitRankConfig(&m.comm, m.size, id, m.rank, &config);
  if (rc != ncclSuccess && rc != ncclInProgress)
    m.failed(rc, "start (ncclCommInitRankConfig)", seq);
  m.poll(
      [](ncclResult_t s) { return s == ncclSuccess; },
      "start (ncclCommInitRankConfig)",
      seq);
  // 4. The communication stream, at the highest priority, so that the
  // collectives' kernels are not queued behind the backward kernels they
  // overlap with; the reused "ready" event.
  int lowest = 0;
  int highest = 0;
  MT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &highest), m.rank);
  MT_CUDA_CHECK(
      cudaStreamCreateWithPriority(&m.stream, cudaStreamNonBlocking, highest),
      m.rank);
  MT_CUDA_CHECK(
      cudaEventCreateWithFlags(&m.ready, cudaEventDisableTiming), m.rank);
}

NcclCommunicator::~NcclCommunicator() = default;

void NcclCommunicator::end_job_after(const CollectiveFailure& failure) {
  Impl& m = *impl_;
  MT_INTERNAL_ASSERT(
      m.on_mpi_thread(),
      "end_job_after must be called from the thread that built the "
      "communicator");
  if (failure.timed_out)
    m.waiter.timed_out(failure.collective, failure.sequence);
  m.end_job(failure.what());
}

void NcclCommunicator::wait_for_device(const std::function<bool()>& done) {
  Impl& m = *impl_;
  const c10::cuda::CUDAGuard guard(m.device);
  m.poll([&](ncclResult_t) { return done(); }, m.last_what, m.last_seq);
}

int NcclCommunicator::rank() const {
  return impl_->rank;
}

int NcclCommunicator::size() const {
  return impl_->size;
}

std::unique_ptr<CollectiveWork> NcclCommunicator::all_reduce_async(
    at::Tensor& t, ReduceOp op) {
  Impl& m = *impl_;
  if (t.defined() && !t.is_cuda())  // a host tensor: through the GPU
    return staged_all_reduce(
        *this,
        t,
        op,
        c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(m.device)));
  auto work = m.launch(t, "all-reduce", [&](cudaStream_t stream) {
    return ncclAllReduce(
        t.data_ptr(),
        t.data_ptr(),
        static_cast<size_t>(t.numel()),
        nccl_type(t),
        nccl_op(op),
        m.comm,
        stream);
  });
  stats_.allreduce_calls += 1;
  stats_.allreduce_bytes += t.numel() * t.element_size();
  return work;
}

void NcclCommunicator::broadcast(at::Tensor& t, int root) {
  Impl& m = *impl_;
  if (t.defined() && !t.is_cuda())
    return staged_broadcast(
        *this,
        t,
        root,
        c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(m.device)));
  auto work = m.launch(t, "broadcast", [&](cudaStream_t stream) {
    return ncclBroadcast(
        t.data_ptr(),
        t.data_ptr(),
        static_cast<size_t>(t.numel()),
        nccl_type(t),
        root,
        m.comm,
        stream);
  });
  stats_.broadcast_calls += 1;
  stats_.broadcast_bytes += t.numel() * t.element_size();
  work->wait();
}

void NcclCommunicator::barrier() {
  Impl& m = *impl_;
  const c10::cuda::CUDAGuard guard(m.device);
  const int64_t seq = m.waiter.next_sequence();
  cudaEvent_t here = nullptr;
  MT_CUDA_CHECK(
      cudaEventCreateWithFlags(&here, cudaEventDisableTiming), m.rank);
  const cudaError_t rc =
      cudaEventRecord(here, c10::cuda::getCurrentCUDAStream(m.device).stream());
  if (rc == cudaSuccess) {
    try {
      m.poll([&](ncclResult_t) { return m.event_done(here); }, "barrier", seq);
    } catch (...) {
      cudaEventDestroy(here);
      throw;
    }
  }
  cudaEventDestroy(here);
  MT_CUDA_CHECK(rc, m.rank);
  MPI_Request request;
  MT_MPI_CHECK(MPI_Ibarrier(m.waiter.comm(), &request), m.rank);
  m.waiter.wait(&request, 1, "barrier", seq);
}

}  // namespace memtrain
