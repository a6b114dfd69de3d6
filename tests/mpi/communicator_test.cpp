#include <gtest/gtest.h>
#include <torch/torch.h>

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "memtrain/config/train_config.h"
#include "memtrain/dist/environment.h"
#include "memtrain/dist/make_communicator.h"
#include "memtrain/dist/mpi_communicator.h"
#include "memtrain/dist/replica_check.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

int world() {
  int w = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  return w;
}

// Ranks of the largest node: the shared-memory path is taken when it holds
// two or more (one node, or several: hierarchical).
int largest_node() {
  MPI_Comm node;
  MPI_Comm_split_type(
      MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 1;
  MPI_Comm_size(node, &local);
  MPI_Comm_free(&node);
  MPI_Allreduce(MPI_IN_PLACE, &local, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return local;
}

// all_gather_rows: rank r's r + 1 rows land at its offset, exactly, on
// every rank; counted as one all-gather, not as an all-reduce.
TEST(MpiCommunicator, AllGatherRowsPlacesEveryRanksRows) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t w = comm.size(), r = comm.rank();
  const int64_t total = w * (w + 1) / 2, offset = r * (r + 1) / 2;
  const auto mine = torch::full({r + 1, 2, 3}, 0.1f * static_cast<float>(r)) +
                    torch::arange(r + 1, torch::kFloat32).view({-1, 1, 1});
  const CommStats before = comm.stats();
  const auto all = comm.all_gather_rows(mine, offset, total);
  ASSERT_EQ(all.sizes(), (std::vector<int64_t>{total, 2, 3}));
  for (int64_t q = 0; q < w; ++q) {
    const auto theirs =
        torch::full({q + 1, 2, 3}, 0.1f * static_cast<float>(q)) +
        torch::arange(q + 1, torch::kFloat32).view({-1, 1, 1});
    EXPECT_TRUE(torch::equal(all.narrow(0, q * (q + 1) / 2, q + 1), theirs))
        << "rows of rank " << q;
  }
  EXPECT_EQ(comm.stats().allgather_calls, before.allgather_calls + 1);
  EXPECT_EQ(comm.stats().allgather_bytes, before.allgather_bytes + total * 24);
  EXPECT_EQ(comm.stats().allreduce_calls, before.allreduce_calls);
}

TEST(MpiCommunicator, AllReduceSumsRankValuedTensorsExactly) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t w = comm.size();
  auto t = torch::full({5}, static_cast<float>(comm.rank()));
  auto d = torch::arange(3, torch::kFloat64) * (comm.rank() + 1);
  auto l = torch::tensor({int64_t{1} << 40}, torch::kInt64);
  comm.all_reduce_sum(t);
  comm.all_reduce_sum(d);
  comm.all_reduce_sum(l);
  EXPECT_TRUE(torch::equal(t, torch::full({5}, w * (w - 1) / 2.0f)));
  EXPECT_TRUE(
      torch::equal(d, torch::arange(3, torch::kFloat64) * (w * (w + 1) / 2.0)));
  EXPECT_EQ(l.item<int64_t>(), w << 40);
  EXPECT_EQ(comm.stats().allreduce_calls, 3);
  EXPECT_EQ(comm.stats().allreduce_bytes, 5 * 4 + 3 * 8 + 8);
}

// Note [Shared-memory all-reduce]: a float32 sum of at least 64 KiB goes
// through the nodes' shared-memory windows, in groups of 4 MiB of 512 KiB
// slots per rank (an uneven last one of each), between nodes through the
// node leaders (hierarchical, when the ranks span several nodes: the
// tests/multinode cluster), and gives the same exact sums as MPI's path
// (integer-valued floats: exact in any order); MEMTRAIN_MPI_SHM=0 keeps
// MPI's path. Small sums and other dtypes always take MPI's, and so does a
// world of one rank per node.
TEST(MpiCommunicator, SharedMemorySumsEqualMpisAndCanBeTurnedOff) {
  const int64_t n = (int64_t{5} << 20) / 2 + 7;  // 20 chunks + 7 floats
  auto values = [](int rank, int64_t count) {
    return torch::remainder(torch::arange(count, torch::kFloat32), 1000.0f) *
           static_cast<float>(rank + 1);
  };
  torch::Tensor via_mpi;
  {
    setenv("MEMTRAIN_MPI_SHM", "0", 1);
    MpiCommunicator comm(MPI_COMM_WORLD);
    via_mpi = values(comm.rank(), n);
    comm.all_reduce_sum(via_mpi);
    EXPECT_FALSE(comm.uses_shared_memory());
    unsetenv("MEMTRAIN_MPI_SHM");
  }
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t w = comm.size();
  auto small = torch::full({16}, static_cast<float>(comm.rank()));
  comm.all_reduce_sum(small);  // below 64 KiB: MPI, decides nothing
  EXPECT_FALSE(comm.uses_shared_memory());
  EXPECT_TRUE(torch::equal(small, torch::full({16}, w * (w - 1) / 2.0f)));
  const bool shared = largest_node() > 1;
  for (int round = 0; round < 3; ++round) {  // both halves of the buffer
    auto t = values(comm.rank(), n - round);
    comm.all_reduce_sum(t);
    EXPECT_EQ(comm.uses_shared_memory(), shared) << comm.sum_path();
    EXPECT_TRUE(torch::equal(t, via_mpi.slice(0, 0, n - round)))
        << "round " << round;
    EXPECT_TRUE(torch::equal(
        t, values(0, n - round) * static_cast<float>(w * (w + 1) / 2)));
  }
  auto d = torch::ones({1 << 15}, torch::kFloat64);  // 256 KiB of doubles
  comm.all_reduce_sum(d);
  EXPECT_TRUE(
      torch::equal(d, torch::full({1 << 15}, double(w), torch::kFloat64)));
  EXPECT_EQ(comm.stats().allreduce_calls, 5);
  EXPECT_EQ(
      comm.stats().allreduce_bytes,
      16 * 4 + (3 * n - 3) * 4 + (int64_t{1} << 15) * 8);
}

// Sums of values whose rounding depends on the order: the shared-memory or
// hierarchical path agrees with the flat MPI_Iallreduce within float32
// rounding (1e-6 relative to the sum of magnitudes), and every rank holds
// the same bits (the replica checks' premise), at a size of 3 groups and
// a part.
TEST(MpiCommunicator, SharedAndHierarchicalSumsMatchFlatWithinRounding) {
  const int64_t n = (int64_t{13} << 20) / 4 + 1001;  // 13 MiB + 1001 floats
  auto values = [&](int rank) {
    torch::manual_seed(1234 + rank);
    return torch::randn({n}) * 1e3f;
  };
  torch::Tensor flat;
  torch::Tensor magnitude;
  {
    setenv("MEMTRAIN_MPI_SHM", "0", 1);
    MpiCommunicator comm(MPI_COMM_WORLD);
    flat = values(comm.rank());
    magnitude = flat.abs();
    comm.all_reduce_sum(flat);
    comm.all_reduce_sum(magnitude);
    if (comm.size() > 1)
      EXPECT_EQ(comm.sum_path(), "flat MPI_Iallreduce");
    unsetenv("MEMTRAIN_MPI_SHM");
  }
  MpiCommunicator comm(MPI_COMM_WORLD);
  auto t = values(comm.rank());
  comm.all_reduce_sum(t);
  const double worst =
      ((t - flat).abs() / magnitude.clamp_min(1e-30f)).max().item<double>();
  EXPECT_LE(worst, 1e-6) << comm.sum_path();
  // Every rank's bits equal rank 0's.
  auto first = t.clone();
  MPI_Bcast(
      first.data_ptr(), static_cast<int>(n), MPI_FLOAT, 0, MPI_COMM_WORLD);
  EXPECT_TRUE(torch::equal(t, first)) << comm.sum_path();
  if (comm.rank() == 0)
    std::printf(
        "[          ] %d ranks, %s: worst relative difference from flat "
        "%.3g\n",
        comm.size(),
        comm.sum_path().c_str(),
        worst);
}

TEST(MpiCommunicator, BroadcastCopiesRootEverywhere) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int root = comm.size() - 1;
  auto t = torch::full({4, 2}, static_cast<float>(comm.rank()));
  comm.broadcast(t, root);
  EXPECT_TRUE(torch::equal(t, torch::full({4, 2}, float(root))));
  EXPECT_EQ(comm.stats().broadcast_bytes, 32);
  EXPECT_EQ(comm.stats().allreduce_calls, 0);
}

// Several all-reduces in flight at once, completed in three patterns (wait
// in issue order, wait in reverse order, poll test() round-robin until all
// are done). Each rank uses a different pattern in each round, so ranks mix
// patterns; the sums must be exact whatever the pattern.
TEST(MpiCommunicator, AsyncAllReducesInFlightSumExactlyInAnyPollingPattern) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t w = comm.size();
  const int64_t r1 = comm.rank() + 1;
  const int64_t tri = w * (w + 1) / 2;  // sum over ranks of (rank + 1)
  int64_t calls = 0;
  int64_t bytes = 0;
  for (int round = 0; round < 3; ++round) {
    std::vector<at::Tensor> ts = {
        torch::arange(7, torch::kFloat64) * r1,
        torch::arange(1 << 18, torch::kInt64) * r1,  // 2 MiB: takes a while
        torch::arange(3, torch::kFloat32) * r1,
        torch::full({4}, static_cast<int32_t>(r1), torch::kInt32),
        torch::full({2}, static_cast<float>(r1)),
    };
    const ReduceOp ops[] = {
        ReduceOp::kSum,
        ReduceOp::kSum,
        ReduceOp::kSum,
        ReduceOp::kMin,
        ReduceOp::kMax};
    std::vector<std::unique_ptr<CollectiveWork>> works;
    for (size_t i = 0; i < ts.size(); ++i) {
      works.push_back(comm.all_reduce_async(ts[i], ops[i]));
      calls += 1;
      bytes += ts[i].numel() * ts[i].element_size();
    }
    // Counted when issued, before anything completed.
    EXPECT_EQ(comm.stats().allreduce_calls, calls);
    EXPECT_EQ(comm.stats().allreduce_bytes, bytes);

    switch ((comm.rank() + round) % 3) {
      case 0:
        for (auto& work : works)
          work->wait();
        break;
      case 1:
        for (auto it = works.rbegin(); it != works.rend(); ++it)
          (*it)->wait();
        break;
      default:
        for (size_t done = 0; done < works.size();) {
          done = 0;
          for (auto& work : works)
            done += work->test() ? 1 : 0;
        }
        for (auto& work : works)
          work->wait();  // after test() said done: returns at once
        break;
    }
    for (auto& work : works)
      EXPECT_TRUE(work->test());

    EXPECT_TRUE(
        torch::equal(ts[0], torch::arange(7, torch::kFloat64) * double(tri)));
    EXPECT_TRUE(
        torch::equal(ts[1], torch::arange(1 << 18, torch::kInt64) * tri));
    EXPECT_TRUE(
        torch::equal(ts[2], torch::arange(3, torch::kFloat32) * float(tri)));
    EXPECT_TRUE(torch::equal(ts[3], torch::full({4}, 1, torch::kInt32)));
    EXPECT_TRUE(torch::equal(ts[4], torch::full({2}, float(w))));
  }
  // all_reduce is all_reduce_async + wait: counted the same way.
  auto t = torch::full({3}, static_cast<double>(r1), torch::kFloat64);
  comm.all_reduce_sum(t);
  EXPECT_TRUE(torch::equal(t, torch::full({3}, double(tri), torch::kFloat64)));
  EXPECT_EQ(comm.stats().allreduce_calls, calls + 1);
  EXPECT_EQ(comm.stats().allreduce_bytes, bytes + 3 * 8);
}

TEST(MpiCommunicator, DestroyingAnUnwaitedWorkWaitsForIt) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t w = comm.size();
  auto t = torch::full({1000}, static_cast<float>(comm.rank()));
  comm.all_reduce_async(t, ReduceOp::kSum).reset();
  EXPECT_TRUE(torch::equal(t, torch::full({1000}, w * (w - 1) / 2.0f)));
}

TEST(ResolveBackend, AutoIsMpiOnTheCpuAndNcclOnACudaDeviceOfACudaBuild) {
  CommunicatorSpec cpu;
  EXPECT_EQ(resolve_backend(cpu), BackendChoice::kMpi);
  CommunicatorSpec gpu;
  gpu.cuda_device = true;
  gpu.device_index = 0;
  EXPECT_EQ(
      resolve_backend(gpu),
      MEMTRAIN_CUDA ? BackendChoice::kNccl : BackendChoice::kMpi);
  gpu.backend = BackendChoice::kMpi;
  EXPECT_EQ(resolve_backend(gpu), BackendChoice::kMpi);
}

std::string refusal(const CommunicatorSpec& spec) {
  try {
    resolve_backend(spec);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ResolveBackend, NcclWithACpuDeviceIsRefused) {
  CommunicatorSpec spec;
  spec.backend = BackendChoice::kNccl;
  const std::string why = refusal(spec);
  EXPECT_NE(why.find("this rank's device is the CPU"), std::string::npos)
      << why;
  EXPECT_NE(why.find("use dist.backend=mpi"), std::string::npos) << why;
}

TEST(ResolveBackend, NcclOnACpuBuildIsRefusedNamingTheBuild) {
  if (MEMTRAIN_CUDA)
    GTEST_SKIP() << "(build) a CUDA build has NCCL";
  CommunicatorSpec spec;
  spec.backend = BackendChoice::kNccl;
  spec.cuda_device = true;
  spec.device_index = 0;
  const std::string why = refusal(spec);
  EXPECT_NE(why.find("built with MEMTRAIN_CUDA=0"), std::string::npos) << why;
  EXPECT_NE(why.find("-DMEMTRAIN_CUDA=ON"), std::string::npos) << why;
}

TEST(ResolveBackend, UnknownBackendIsRefused) {
  // It never reaches resolve_backend: the config refuses it, naming the
  // backends.
  std::string why;
  try {
    TrainConfig::load("", {"dist.backend=gloo"});
  } catch (const Error& e) {
    why = e.what();
  }
  EXPECT_NE(why.find("'gloo'"), std::string::npos) << why;
  EXPECT_NE(why.find("one of auto, mpi, nccl"), std::string::npos) << why;
}

TEST(MakeCommunicator, BuildsTheResolvedBackendOverTheGivenCommunicator) {
  CommunicatorSpec spec;
  spec.timeout_s = 60;
  auto comm = make_communicator(MPI_COMM_WORLD, spec);
  EXPECT_EQ(comm->backend(), BackendChoice::kMpi);
  EXPECT_EQ(comm->size(), world());
  const int64_t w = comm->size();
  auto t = torch::full({2}, static_cast<float>(comm->rank() + 1));
  comm->all_reduce_sum(t);
  EXPECT_TRUE(torch::equal(t, torch::full({2}, w * (w + 1) / 2.0f)));
}

// One rank's spec is refused: it throws its own Error and every other rank
// a PeerError, all from the same agreement, so nobody waits for a peer.
TEST(MakeCommunicator, OneRefusedRankFailsEveryRankAlike) {
  CommunicatorSpec spec;
  spec.timeout_s = 60;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const bool refused = rank == world() - 1;
  if (refused)
    spec.backend = BackendChoice::kNccl;  // with a CPU device
  std::string kind = "none";
  try {
    make_communicator(MPI_COMM_WORLD, spec);
  } catch (const PeerError&) {
    kind = "peer";
  } catch (const Error& e) {
    kind = "own";
    EXPECT_NE(
        std::string(e.what()).find("this rank's device is the CPU"),
        std::string::npos);
  }
  EXPECT_EQ(kind, refused ? "own" : "peer");
}

// A write to a peer whose socket closed (a node lost) is an error MPI
// reports, not a SIGPIPE that ends the rank before the timeout names who
// is missing.
TEST(Environment, IgnoresSigpipe) {
  signal(SIGPIPE, SIG_DFL);
  Environment env(nullptr, nullptr);  // MPI is already initialised
  struct sigaction now {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, SIG_IGN);
}

// Environment's start-up collectives, now polled against a timeout: the
// same answers as before.
TEST(Environment, AllOkAndAllGatherWithinTheCollectiveTimeout) {
  Environment env(nullptr, nullptr);  // MPI is already initialised
  EXPECT_EQ(env.collective_timeout(), 600.0);
  env.set_collective_timeout(30);
  EXPECT_EQ(env.collective_timeout(), 30.0);
  const int w = env.world_size();
  int first = -1;
  EXPECT_TRUE(env.all_ok(true, &first));
  EXPECT_EQ(first, w);
  // Ranks w-1 and (for w > 2) 1 fail: the lowest failing rank is reported.
  const bool ok = !(env.rank() == w - 1 || (w > 2 && env.rank() == 1));
  EXPECT_FALSE(env.all_ok(ok, &first));
  EXPECT_EQ(first, w > 2 ? 1 : w - 1);
  const auto all = env.all_gather("rank " + std::to_string(env.rank()));
  ASSERT_EQ(static_cast<int>(all.size()), w);
  for (int r = 0; r < w; ++r)
    EXPECT_EQ(all[static_cast<size_t>(r)], "rank " + std::to_string(r));
}

TEST(ReplicaCheck, DetectsOneDivergentRank) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  std::vector<at::Tensor> params = {torch::ones({3, 3}), torch::zeros({2})};
  uint64_t mine = 0;
  EXPECT_TRUE(replicas_identical(comm, params, &mine));
  if (comm.size() > 1) {
    if (comm.rank() == comm.size() - 1) {
      // One bit of one element.
      params[0].view(-1)[4] = std::nextafter(1.0f, 2.0f);
    }
    EXPECT_FALSE(replicas_identical(comm, params, &mine));
  }
}

}  // namespace
}  // namespace memtrain
