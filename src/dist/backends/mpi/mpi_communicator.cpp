#include "memtrain/dist/mpi_communicator.h"

#include <torch/torch.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "memtrain/util/error.h"

namespace memtrain {
namespace {

MPI_Datatype mpi_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return MPI_FLOAT;
    case at::kDouble:
      return MPI_DOUBLE;
    case at::kLong:
      return MPI_INT64_T;
    case at::kInt:
      return MPI_INT32_T;
    default:
      throw InternalError(
          std::string("MpiCommunicator: unsupported dtype ") +
          std::string(c10::toString(t.scalar_type())) +
          " (MPI has no half types: reduce in float32)");
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return MPI_SUM;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
  }
  return MPI_SUM;
}

// Dense in memory, in any order of dimensions (a channels-last weight):
// an element-wise collective on its numel() elements from data_ptr() is
// right when every rank has the same layout, which one model config gives.
void check_tensor(const at::Tensor& t) {
  MT_INTERNAL_ASSERT(
      t.defined() && t.is_non_overlapping_and_dense() && t.device().is_cpu(),
      "MpiCommunicator needs a dense host tensor");
}

// A collective in flight: its MPI requests (one per piece) and its number.
// It refers to its communicator's waiter, so it must not outlive the
// communicator.
class MpiWork final : public CollectiveWork {
 public:
  MpiWork(
      const MpiWaiter& waiter,
      std::vector<MPI_Request> requests,
      const char* what,
      int64_t sequence)
      : waiter_(waiter),
        requests_(std::move(requests)),
        what_(what),
        sequence_(sequence) {}

  ~MpiWork() override {
    if (done_ || waited_)
      return;
    try {
      wait();
    } catch (const std::exception& e) {
      // A destructor must not throw; the error is MPI's, and the next
      // collective will meet it too.
      std::fprintf(stderr, "memtrain: error: %s\n", e.what());
    }
  }

  void wait() override {
    if (done_)
      return;
    waited_ = true;  // if it throws, the destructor does not try again
    waiter_.wait(
        requests_.data(), static_cast<int>(requests_.size()), what_, sequence_);
    done_ = true;
  }

  bool test() override {
    if (!done_)
      done_ =
          waiter_.test(requests_.data(), static_cast<int>(requests_.size()));
    return done_;
  }

 private:
  const MpiWaiter& waiter_;
  std::vector<MPI_Request> requests_;
  const char* what_;
  int64_t sequence_;
  bool done_ = false;
  bool waited_ = false;
};

// Sums of fewer bytes go through MPI: latency, not bandwidth, rules there.
constexpr int64_t kShmMinBytes = 64 * 1024;
// Floats per rank per half of the double buffer: pieces that stay in the
// caches while they are copied in, summed and copied out. Measured on the
// 2-core development machine (bench_allreduce, 2 ranks, 1-16 MiB sums):
// 4 MiB pieces 0.51-0.82x of MPI_Allreduce, 128 KiB 0.82-1.16x, 256 KiB
// 0.97-1.52x, 512 KiB 1.07-1.42x.
constexpr int64_t kShmSlotFloats = int64_t{1} << 17;  // 512 KiB

}  // namespace

// Note [Shared-memory all-reduce]
// Open MPI's shared-memory transport moves a large message through small
// fragments, or with one copy through CMA (process_vm_readv), which needs
// ptrace rights that containers often lack (launch/env.sh turns it off).
// Without it a 64 MiB float32 MPI_Iallreduce between 2 ranks on one node
// took 0.2-0.5 s on the 2-core development machine, against 0.1 s for
// gloo over TCP loopback (benchmarks/vs_pytorch). When every rank of the
// communicator is on one node, a float32 sum of at least 64 KiB goes
// through an MPI-3 shared-memory window instead (0.03 s for the same
// 64 MiB): each rank copies a chunk of its tensor into its slot; after a
// barrier rank r sums its 1/size of the chunk over all slots, in rank
// order, into its own slot; after a second barrier every rank copies the
// summed parts out. Each element is summed by one rank, in one order, so
// every rank gets bit-identical results (as replica checks require). The
// slots are double-buffered: a rank writes chunk k+2 only after the
// barrier that follows every rank's reading of chunk k. Barriers are
// MPI_Ibarrier polled by the MpiWaiter, so collective timeouts hold; the
// work is complete when all_reduce_async returns (it cannot overlap with
// backward, but it is shorter than the non-blocking MPI path was even
// when overlapped). Set up collectively at the first such sum (after a
// polled barrier, so a missing rank is named rather than waited for);
// the window lives until MPI_Finalize, which frees it. MEMTRAIN_MPI_SHM=0
// turns it off (the ranks agree on it), and so does a window that cannot be
// allocated on any rank.
struct MpiCommunicator::Shm {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Win win = MPI_WIN_NULL;
  std::vector<float*> slots;  // rank q's slot pair: slots[q], + kShmSlotFloats
  int parity = 0;
};

MpiCommunicator::MpiCommunicator(MPI_Comm comm, double timeout_s)
    : waiter_(comm, timeout_s) {
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);
}

MpiCommunicator::~MpiCommunicator() = default;

bool MpiCommunicator::uses_shared_memory() const {
  return shm_ != nullptr;
}

bool MpiCommunicator::shm_ready() {
  if (shm_decided_)
    return shm_ != nullptr;
  shm_decided_ = true;
  // Every rank arrives here in the same collective: make sure they all
  // did (within the timeout) before the blocking set-up calls.
  barrier();
  const char* env = std::getenv("MEMTRAIN_MPI_SHM");
  const bool wanted =
      !(env && (std::strcmp(env, "0") == 0 || std::strcmp(env, "off") == 0));
  MPI_Comm node = MPI_COMM_NULL;
  MT_MPI_CHECK(
      MPI_Comm_split_type(
          waiter_.comm(), MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
      rank_);
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  int ok = wanted && node_size == size_ ? 1 : 0;
  MT_MPI_CHECK(
      MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, waiter_.comm()),
      rank_);
  if (!ok) {
    MPI_Comm_free(&node);
    return false;
  }
  auto shm = std::make_unique<Shm>();
  shm->node = node;
  MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN);
  float* base = nullptr;
  // A window the node cannot give (a small /dev/shm in a container, say)
  // leaves the sums on MPI's path, on every rank alike.
  int allocated = MPI_Win_allocate_shared(
                      static_cast<MPI_Aint>(2 * kShmSlotFloats * sizeof(float)),
                      static_cast<int>(sizeof(float)),
                      MPI_INFO_NULL,
                      node,
                      &base,
                      &shm->win) == MPI_SUCCESS
                      ? 1
                      : 0;
  MT_MPI_CHECK(
      MPI_Allreduce(
          MPI_IN_PLACE, &allocated, 1, MPI_INT, MPI_MIN, waiter_.comm()),
      rank_);
  if (!allocated)
    return false;  // the node communicator and any window stay until exit
  shm->slots.resize(static_cast<size_t>(size_));
  for (int q = 0; q < size_; ++q) {
    MPI_Aint bytes = 0;
    int unit = 0;
    MT_MPI_CHECK(
        MPI_Win_shared_query(shm->win, q, &bytes, &unit, &shm->slots[q]),
        rank_);
    MT_INTERNAL_ASSERT(
        bytes >= static_cast<MPI_Aint>(2 * kShmSlotFloats * sizeof(float)),
        "shared-memory window smaller than asked");
  }
  MT_MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, shm->win), rank_);
  shm_ = std::move(shm);
  return true;
}

// A barrier of the node whose memory effects are ordered: what every rank
// wrote to the window before it is visible to every rank after it.
void MpiCommunicator::shm_step(int64_t sequence) {
  MT_MPI_CHECK(MPI_Win_sync(shm_->win), rank_);
  MPI_Request request = MPI_REQUEST_NULL;
  MT_MPI_CHECK(MPI_Ibarrier(shm_->node, &request), rank_);
  waiter_.wait(&request, 1, "all-reduce", sequence);
  MT_MPI_CHECK(MPI_Win_sync(shm_->win), rank_);
}

// See Note [Shared-memory all-reduce]. False: not applicable, nothing done.
bool MpiCommunicator::shm_all_reduce(at::Tensor& t, ReduceOp op) {
  if (op != ReduceOp::kSum || t.scalar_type() != at::kFloat || size_ < 2 ||
      t.numel() * static_cast<int64_t>(sizeof(float)) < kShmMinBytes ||
      !shm_ready())
    return false;
  const int64_t sequence = waiter_.next_sequence();
  float* data = t.data_ptr<float>();
  const int64_t n = t.numel();
  const int64_t P = size_;
  for (int64_t off = 0; off < n; off += kShmSlotFloats) {
    const int64_t len = std::min(kShmSlotFloats, n - off);
    const int64_t half = shm_->parity * kShmSlotFloats;
    float* mine = shm_->slots[rank_] + half;
    std::memcpy(mine, data + off, static_cast<size_t>(len) * sizeof(float));
    shm_step(sequence);
    const int64_t begin = len * rank_ / P;
    const int64_t end = len * (rank_ + 1) / P;
    const float* s0 = shm_->slots[0] + half;
    const float* s1 = shm_->slots[1] + half;
    for (int64_t i = begin; i < end; ++i) {
      float acc = s0[i] + s1[i];
      for (int64_t q = 2; q < P; ++q)
        acc += shm_->slots[q][half + i];
      mine[i] = acc;
    }
    shm_step(sequence);
    for (int64_t q = 0; q < P; ++q) {
      const int64_t b = len * q / P;
      const int64_t e = len * (q + 1) / P;
      std::memcpy(
          data + off + b,
          shm_->slots[q] + half + b,
          static_cast<size_t>(e - b) * sizeof(float));
    }
    shm_->parity ^= 1;
  }
  return true;
}

std::unique_ptr<CollectiveWork> MpiCommunicator::all_reduce_async(
    at::Tensor& t, ReduceOp op) {
  if (t.defined() && !t.device().is_cpu())  // a GPU tensor: through the host
    return staged_all_reduce(*this, t, op, c10::Device(c10::kCPU));
  check_tensor(t);
  if (shm_all_reduce(t, op)) {
    stats_.allreduce_calls += 1;
    stats_.allreduce_bytes += t.numel() * t.element_size();
    return std::make_unique<MpiWork>(
        waiter_, std::vector<MPI_Request>{}, "all-reduce", 0);
  }
  const MPI_Datatype type = mpi_type(t);
  char* data = static_cast<char*>(t.data_ptr());
  const int64_t elem = t.element_size();
  std::vector<MPI_Request> requests;
  for (int64_t done = 0; done < t.numel();) {
    const int64_t n = std::min<int64_t>(t.numel() - done, INT_MAX);
    requests.push_back(MPI_REQUEST_NULL);
    MT_MPI_CHECK(
        MPI_Iallreduce(
            MPI_IN_PLACE,
            data + done * elem,
            static_cast<int>(n),
            type,
            mpi_op(op),
            waiter_.comm(),
            &requests.back()),
        rank_);
    done += n;
  }
  stats_.allreduce_calls += 1;
  stats_.allreduce_bytes += t.numel() * elem;
  return std::make_unique<MpiWork>(
      waiter_, std::move(requests), "all-reduce", waiter_.next_sequence());
}

void MpiCommunicator::broadcast(at::Tensor& t, int root) {
  if (t.defined() && !t.device().is_cpu())
    return staged_broadcast(*this, t, root, c10::Device(c10::kCPU));
  check_tensor(t);
  const int64_t bytes = t.numel() * t.element_size();
  char* data = static_cast<char*>(t.data_ptr());
  std::vector<MPI_Request> requests;
  for (int64_t done = 0; done < bytes;) {
    const int64_t n = std::min<int64_t>(bytes - done, INT_MAX);
    requests.push_back(MPI_REQUEST_NULL);
    MT_MPI_CHECK(
        MPI_Ibcast(
            data + done,
            static_cast<int>(n),
            MPI_BYTE,
            root,
            waiter_.comm(),
            &requests.back()),
        rank_);
    done += n;
  }
  stats_.broadcast_calls += 1;
  stats_.broadcast_bytes += bytes;
  MpiWork(waiter_, std::move(requests), "broadcast", waiter_.next_sequence())
      .wait();
}

void MpiCommunicator::barrier() {
  std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
  MT_MPI_CHECK(MPI_Ibarrier(waiter_.comm(), &requests[0]), rank_);
  MpiWork(waiter_, std::move(requests), "barrier", waiter_.next_sequence())
      .wait();
}

}  // namespace memtrain
