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
// caches while they are copied in and summed. Measured on the 2-core
// development machine (bench_allreduce, 2 ranks, 1-16 MiB sums): 4 MiB
// pieces 0.51-0.82x of MPI_Allreduce, 128 KiB 0.82-1.16x, 256 KiB
// 0.97-1.52x, 512 KiB 1.07-1.42x.
constexpr int64_t kShmSlotFloats = int64_t{1} << 17;  // 512 KiB
// Floats per group: the node's sum of a group is what the node leaders
// all-reduce between nodes in one ring, while the node sums the next.
constexpr int64_t kShmGroupFloats = 8 * kShmSlotFloats;  // 4 MiB
// Tag of the leaders' ring messages (their own communicator).
constexpr int kRingTag = 7402;

}  // namespace

// The node leaders' all-reduce of one group: a ring, reduce-scatter then
// all-gather, in point-to-point messages that progress() moves on step by
// step, so the node phase of the next group runs while it is in flight.
// Each node's link carries 2(N-1)/N of the group each way, the bandwidth
// bound (Open MPI's non-blocking MPI_Iallreduce in place reduces to one
// rank and broadcasts back: twice the bytes, one way at a time). Segment s
// is summed along the ring in one order, then copied to every leader: all
// leaders get the same bits.
class MpiCommunicator::LeaderRing {
 public:
  LeaderRing(MPI_Comm comm, int world_rank) : comm_(comm), rank_(world_rank) {
    MPI_Comm_rank(comm, &me_);
    MPI_Comm_size(comm, &n_);
    tmp_.resize(static_cast<size_t>(kShmGroupFloats / n_ + 1));
  }
  bool active() const {
    return active_;
  }
  void start(float* buf, int64_t len) {
    MT_INTERNAL_ASSERT(!active_, "a leaders' ring is already in flight");
    buf_ = buf;
    len_ = len;
    step_ = 0;
    active_ = true;
    post();
  }
  // Moves the ring on if its current step completed; true once the whole
  // all-reduce has.
  bool progress() {
    if (!active_)
      return true;
    int done = 0;
    MT_MPI_CHECK(MPI_Testall(2, requests_, &done, MPI_STATUSES_IGNORE), rank_);
    if (!done)
      return false;
    if (step_ < n_ - 1) {  // reduce-scatter: add the left's partial sum
      float* into = buf_ + begin(recv_seg_);
      const int64_t count = begin(recv_seg_ + 1) - begin(recv_seg_);
      for (int64_t i = 0; i < count; ++i)
        into[i] += tmp_[static_cast<size_t>(i)];
    }
    if (++step_ == 2 * (n_ - 1)) {
      active_ = false;
      return true;
    }
    post();
    return false;
  }
  MPI_Request* requests() {
    return requests_;
  }

 private:
  int64_t begin(int seg) const {
    return len_ * seg / n_;
  }
  // Step t < N-1 (reduce-scatter): send segment me-t, receive me-t-1 into
  // tmp. Step N-1+u (all-gather): send segment me+1-u (summed), receive
  // me-u in place.
  void post() {
    const bool reduce = step_ < n_ - 1;
    const int t = reduce ? step_ : step_ - (n_ - 1);
    const int send_seg = ((reduce ? me_ - t : me_ + 1 - t) % n_ + n_) % n_;
    recv_seg_ = ((reduce ? me_ - t - 1 : me_ - t) % n_ + n_) % n_;
    const int right = (me_ + 1) % n_;
    const int left = (me_ + n_ - 1) % n_;
    const int64_t recv_count = begin(recv_seg_ + 1) - begin(recv_seg_);
    MT_MPI_CHECK(
        MPI_Irecv(
            reduce ? tmp_.data() : buf_ + begin(recv_seg_),
            static_cast<int>(recv_count),
            MPI_FLOAT,
            left,
            kRingTag,
            comm_,
            &requests_[0]),
        rank_);
    MT_MPI_CHECK(
        MPI_Isend(
            buf_ + begin(send_seg),
            static_cast<int>(begin(send_seg + 1) - begin(send_seg)),
            MPI_FLOAT,
            right,
            kRingTag,
            comm_,
            &requests_[1]),
        rank_);
  }

  MPI_Comm comm_;
  int rank_;  // in the world, for messages
  int me_ = 0;
  int n_ = 1;
  std::vector<float> tmp_;
  float* buf_ = nullptr;
  int64_t len_ = 0;
  int step_ = 0;
  int recv_seg_ = 0;
  bool active_ = false;
  MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
};

// Note [Shared-memory all-reduce]
// Open MPI's shared-memory transport moves a large message through small
// fragments, or with one copy through CMA (process_vm_readv), which needs
// ptrace rights that containers often lack (launch/env.sh turns it off).
// Without it a 64 MiB float32 MPI_Iallreduce between 2 ranks on one node
// took 0.2-0.5 s on the 2-core development machine, against 0.1 s for
// gloo over TCP loopback (benchmarks/vs_pytorch). So a float32 sum of at
// least 64 KiB goes through an MPI-3 shared-memory window of each node
// instead (0.03 s for the same 64 MiB on one node), in groups of
// kShmGroupFloats, each in slots of kShmSlotFloats:
// - slot by slot, every rank copies its piece of the tensor into its own
//   slot; after a barrier of the node, local rank r sums its 1/L share of
//   the piece over the node's L slots, in local-rank order, into the
//   group's result buffer (in the node leader's, local rank 0's, part of
//   the window). Slots are double-buffered: a rank writes piece k+2 only
//   after the barrier that follows every rank's summing of piece k;
// - after the group's last piece, a barrier: the result holds the node's
//   sum of the group;
// - one node (every rank of the communicator on it): every rank copies
//   the group out of the result;
// - several nodes (hierarchical): the node leaders all-reduce the result
//   among themselves in a ring of point-to-point messages (LeaderRing) and
//   go on with the next group's node phase while it is in flight, moving
//   it on from every poll of the node's barriers (the result is double-
//   buffered too); after that group's node phase, the leader completes
//   it, a barrier of the node, and every rank copies it out.
// Each element's node sum is made by one rank in one order and its total
// by the leaders' ring, then copied to every rank of the node, so
// every rank gets bit-identical results (as replica checks require); on
// one node they are bit-identical to the earlier one-phase algorithm (the
// same order). Only the leaders' traffic crosses between nodes: the node's
// ranks send it once, not L times as the flat MPI_Iallreduce would. Nodes
// of one rank each gain nothing from it: there the flat path is kept.
// Barriers are MPI_Ibarrier and the leaders' ring MPI_Isend/MPI_Irecv,
// polled by the MpiWaiter, so collective timeouts hold (and name the world
// ranks and hosts that did not arrive); the work is complete when
// all_reduce_async returns (it cannot overlap with backward, but it is
// shorter than the non-blocking MPI path was even when overlapped). Set up
// collectively at the first such sum (after a polled barrier, so a missing
// rank is named rather than waited for); the window lives until
// MPI_Finalize, which frees it. MEMTRAIN_MPI_SHM=0 (or off) keeps every
// sum on the flat MPI_Iallreduce (the ranks agree on it), and so does a
// window that cannot be allocated on any rank.
struct MpiCommunicator::Shm {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm leaders = MPI_COMM_NULL;  // local rank 0 of each node; only
                                     // there, and with several nodes
  MPI_Win win = MPI_WIN_NULL;
  int local_rank = 0;
  int local_size = 1;
  int nodes = 1;
  std::vector<float*> slots;         // local rank q's slot pair: slots[q], + S
  float* result = nullptr;           // the leader's result pair: result, + G
  int parity = 0;                    // the slot half the next piece goes into
  std::unique_ptr<LeaderRing> ring;  // leaders of several nodes only
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

std::string MpiCommunicator::sum_path() const {
  if (!shm_)
    return shm_decided_ ? "flat MPI_Iallreduce"
                        : "not decided (no float32 sum of 64 KiB yet)";
  if (shm_->nodes == 1)
    return detail::concat(
        "shared memory of the node (", shm_->local_size, " ranks)");
  return detail::concat(
      "hierarchical: shared memory within each node, the leaders of ",
      shm_->nodes,
      " nodes in a ring over MPI");
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
  int local_rank = 0;
  int local_size = 0;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  // Nodes, and the largest node: with one rank on every node there is
  // nothing to share.
  int counts[2] = {local_rank == 0 ? 1 : 0, local_size};
  MT_MPI_CHECK(
      MPI_Allreduce(
          MPI_IN_PLACE, &counts[0], 1, MPI_INT, MPI_SUM, waiter_.comm()),
      rank_);
  MT_MPI_CHECK(
      MPI_Allreduce(
          MPI_IN_PLACE, &counts[1], 1, MPI_INT, MPI_MAX, waiter_.comm()),
      rank_);
  const int nodes = counts[0];
  int ok = wanted && counts[1] > 1 ? 1 : 0;
  MPI_Comm leaders = MPI_COMM_NULL;
  if (ok && nodes > 1) {
    MT_MPI_CHECK(
        MPI_Comm_split(
            waiter_.comm(),
            local_rank == 0 ? 0 : MPI_UNDEFINED,
            rank_,
            &leaders),
        rank_);
  }
  if (!ok) {
    MPI_Comm_free(&node);
    return false;
  }
  auto shm = std::make_unique<Shm>();
  shm->node = node;
  shm->leaders = leaders;
  shm->local_rank = local_rank;
  shm->local_size = local_size;
  shm->nodes = nodes;
  MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN);
  if (leaders != MPI_COMM_NULL)
    MPI_Comm_set_errhandler(leaders, MPI_ERRORS_RETURN);
  // Every rank's slot pair; the leader's result pair after its slots.
  const int64_t floats =
      2 * kShmSlotFloats + (local_rank == 0 ? 2 * kShmGroupFloats : 0);
  float* base = nullptr;
  // A window the node cannot give (a small /dev/shm in a container, say)
  // leaves the sums on MPI's path, on every rank alike.
  int allocated = MPI_Win_allocate_shared(
                      static_cast<MPI_Aint>(floats * sizeof(float)),
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
    return false;  // the communicators and any window stay until exit
  shm->slots.resize(static_cast<size_t>(local_size));
  for (int q = 0; q < local_size; ++q) {
    MPI_Aint bytes = 0;
    int unit = 0;
    MT_MPI_CHECK(
        MPI_Win_shared_query(shm->win, q, &bytes, &unit, &shm->slots[q]),
        rank_);
    MT_INTERNAL_ASSERT(
        bytes >= static_cast<MPI_Aint>(2 * kShmSlotFloats * sizeof(float)),
        "shared-memory window smaller than asked");
  }
  shm->result = shm->slots[0] + 2 * kShmSlotFloats;
  if (leaders != MPI_COMM_NULL)
    shm->ring = std::make_unique<LeaderRing>(leaders, rank_);
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
  LeaderRing* ring = shm_->ring.get();
  if (ring && ring->active())
    waiter_.wait(
        &request, 1, "all-reduce", sequence, [ring] { ring->progress(); });
  else
    waiter_.wait(&request, 1, "all-reduce", sequence);
  MT_MPI_CHECK(MPI_Win_sync(shm_->win), rank_);
}

// See Note [Shared-memory all-reduce]. False: not applicable, nothing done.
bool MpiCommunicator::shm_all_reduce(at::Tensor& t, ReduceOp op) {
  if (op != ReduceOp::kSum || t.scalar_type() != at::kFloat || size_ < 2 ||
      t.numel() * static_cast<int64_t>(sizeof(float)) < kShmMinBytes ||
      !shm_ready())
    return false;
  Shm& shm = *shm_;
  const int64_t sequence = waiter_.next_sequence();
  float* data = t.data_ptr<float>();
  const int64_t n = t.numel();
  const int64_t L = shm.local_size;
  const int64_t me = shm.local_rank;
  LeaderRing* ring = shm.ring.get();
  auto copy_out = [&](int64_t group) {
    const int64_t off = group * kShmGroupFloats;
    const int64_t len = std::min(kShmGroupFloats, n - off);
    std::memcpy(
        data + off,
        shm.result + (group & 1) * kShmGroupFloats,
        static_cast<size_t>(len) * sizeof(float));
  };
  // Several nodes: group `group`'s total is complete on every rank of the
  // node once its leader's ring is.
  auto finish = [&](int64_t group) {
    while (ring && !ring->progress())
      waiter_.wait(ring->requests(), 2, "all-reduce", sequence);
    shm_step(sequence);
    copy_out(group);
  };
  const int64_t groups = (n + kShmGroupFloats - 1) / kShmGroupFloats;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t goff = g * kShmGroupFloats;
    const int64_t glen = std::min(kShmGroupFloats, n - goff);
    float* result = shm.result + (g & 1) * kShmGroupFloats;
    for (int64_t off = 0; off < glen; off += kShmSlotFloats) {
      const int64_t len = std::min(kShmSlotFloats, glen - off);
      const int64_t half = shm.parity * kShmSlotFloats;
      std::memcpy(
          shm.slots[me] + half,
          data + goff + off,
          static_cast<size_t>(len) * sizeof(float));
      shm_step(sequence);
      const int64_t begin = len * me / L;
      const int64_t end = len * (me + 1) / L;
      const float* s0 = shm.slots[0] + half;
      for (int64_t i = begin; i < end; ++i) {
        float acc = s0[i];
        for (int64_t q = 1; q < L; ++q)
          acc += shm.slots[q][half + i];
        result[off + i] = acc;
      }
      shm.parity ^= 1;
    }
    shm_step(sequence);  // the node's sum of group g is whole
    if (shm.nodes == 1) {
      copy_out(g);
      continue;
    }
    if (g > 0)
      finish(g - 1);
    if (ring)
      ring->start(result, glen);
  }
  if (shm.nodes > 1)
    finish(groups - 1);
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
