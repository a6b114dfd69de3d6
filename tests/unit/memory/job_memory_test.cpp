// util/host_memory.h's job_memory: what a job may hold on its node, read
// from a cgroup tree and SLURM's variables written here as a machine
// would have them.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>

#include "memtrain/memory/host_plan.h"
#include "memtrain/util/error.h"
#include "memtrain/util/host_memory.h"

namespace memtrain {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

// A folder standing for /proc/self/cgroup and /sys/fs/cgroup.
class FakeHost {
 public:
  FakeHost() {
    char templ[] = "/tmp/memtrain_job_memory_XXXXXX";
    dir_ = ::mkdtemp(templ);
  }
  ~FakeHost() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  void write(const std::string& rel, const std::string& text) {
    const fs::path p = fs::path(dir_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::string proc() const {
    return dir_ + "/proc_cgroup";
  }
  std::string root() const {
    return dir_ + "/sys";
  }
  JobMemory read(
      uint64_t physical, std::map<std::string, std::string> env = {}) {
    return job_memory(physical, proc(), root(), [env](const char* name) {
      const auto it = env.find(name);
      return it == env.end() ? nullptr : it->second.c_str();
    });
  }

 private:
  std::string dir_;
};

TEST(JobMemory, PhysicalMemoryWithoutLimits) {
  FakeHost h;
  h.write("proc_cgroup", "0::/user.slice/session-1.scope\n");
  h.write("sys/user.slice/session-1.scope/memory.max", "max\n");
  const JobMemory job = h.read(64 * kGiB);
  EXPECT_EQ(job.bytes, 64 * kGiB);
  EXPECT_EQ(job.source, "physical memory");
  EXPECT_TRUE(job.unreadable.empty());
}

// cgroup v2: the least memory.max from the process's cgroup up to the
// root, named by its file.
TEST(JobMemory, TheLeastCgroupV2LimitOnThePathToTheRoot) {
  FakeHost h;
  h.write("proc_cgroup", "0::/system.slice/slurmstepd.scope/job_12/step_0\n");
  h.write("sys/system.slice/slurmstepd.scope/job_12/step_0/memory.max", "max");
  h.write(
      "sys/system.slice/slurmstepd.scope/job_12/memory.max",
      std::to_string(6 * kGiB));
  h.write("sys/system.slice/memory.max", std::to_string(20 * kGiB));
  const JobMemory job = h.read(64 * kGiB);
  EXPECT_EQ(job.bytes, 6 * kGiB);
  EXPECT_EQ(
      job.source,
      "cgroup memory.max of /system.slice/slurmstepd.scope/job_12/step_0 (" +
          h.root() + "/system.slice/slurmstepd.scope/job_12/memory.max)");
}

// A container's own cgroup ("0::/") is the root of what it sees.
TEST(JobMemory, AContainersCgroupRoot) {
  FakeHost h;
  h.write("proc_cgroup", "0::/\n");
  h.write("sys/memory.max", std::to_string(3 * kGiB));
  EXPECT_EQ(h.read(64 * kGiB).bytes, 3 * kGiB);
}

// cgroup v1: the memory controller's hierarchy, its "no limit" (near
// 2^63) above the machine's memory.
TEST(JobMemory, CgroupV1) {
  FakeHost h;
  h.write(
      "proc_cgroup",
      "5:cpu,cpuacct:/slurm/uid_0/job_7\n4:memory:/slurm/uid_0/job_7\n");
  h.write("sys/memory/slurm/memory.limit_in_bytes", "9223372036854771712");
  h.write(
      "sys/memory/slurm/uid_0/job_7/memory.limit_in_bytes",
      std::to_string(5 * kGiB));
  const JobMemory job = h.read(64 * kGiB);
  EXPECT_EQ(job.bytes, 5 * kGiB);
  EXPECT_NE(
      job.source.find("memory.limit_in_bytes of /slurm/uid_0/job_7"),
      std::string::npos)
      << job.source;
}

// SLURM's declared memory, in MiB, wins where it is below the cgroup's
// (the cgroup is not always enforced: ConstrainRAMSpace=no).
TEST(JobMemory, SlurmsVariables) {
  FakeHost h;
  h.write("proc_cgroup", "0::/job\n");
  h.write("sys/job/memory.max", std::to_string(8 * kGiB));
  JobMemory job = h.read(64 * kGiB, {{"SLURM_MEM_PER_NODE", "4096"}});
  EXPECT_EQ(job.bytes, 4096 * kMiB);
  EXPECT_EQ(job.source, "SLURM_MEM_PER_NODE=4096 (MiB, --mem)");
  job = h.read(
      64 * kGiB, {{"SLURM_MEM_PER_CPU", "1500"}, {"SLURM_CPUS_ON_NODE", "4"}});
  EXPECT_EQ(job.bytes, 6000 * kMiB);
  EXPECT_EQ(job.source, "SLURM_MEM_PER_CPU=1500 (MiB) x SLURM_CPUS_ON_NODE=4");
  job = h.read(
      64 * kGiB, {{"SLURM_MEM_PER_GPU", "3000"}, {"SLURM_GPUS_ON_NODE", "2"}});
  EXPECT_EQ(job.bytes, 6000 * kMiB);
  // Above the cgroup's: the cgroup holds.
  job = h.read(64 * kGiB, {{"SLURM_MEM_PER_NODE", "16384"}});
  EXPECT_EQ(job.bytes, 8 * kGiB);
  // --mem=0: all of the node's memory.
  job = h.read(64 * kGiB, {{"SLURM_MEM_PER_NODE", "0"}});
  EXPECT_EQ(job.bytes, 8 * kGiB);
  // Per CPU without the count: said, not guessed.
  job = h.read(64 * kGiB, {{"SLURM_MEM_PER_CPU", "1500"}});
  EXPECT_EQ(job.bytes, 8 * kGiB);
  ASSERT_EQ(job.unreadable.size(), 1u);
  EXPECT_NE(
      job.unreadable[0].find("without SLURM_CPUS_ON_NODE"), std::string::npos);
}

TEST(JobMemory, NamesWhatItCannotRead) {
  FakeHost h;
  h.write("proc_cgroup", "0::/job\n");
  h.write("sys/job/memory.max", "lots\n");
  const JobMemory job = h.read(64 * kGiB);
  EXPECT_EQ(job.bytes, 64 * kGiB);
  ASSERT_EQ(job.unreadable.size(), 1u);
  EXPECT_EQ(job.unreadable[0], h.root() + "/job/memory.max (\"lots\")");
  try {
    h.read(64 * kGiB, {{"SLURM_MEM_PER_NODE", "4G"}});
    ADD_FAILURE() << "SLURM_MEM_PER_NODE=4G was taken";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("SLURM_MEM_PER_NODE=\"4G\""),
        std::string::npos)
        << e.what();
  }
}

// memory.host_budget=auto names the job's limit and what could not be
// read.
TEST(JobMemory, HostBudgetAutoNamesTheJobsLimit) {
  JobMemory job;
  job.bytes = 8 * kGiB;
  job.source = "SLURM_MEM_PER_NODE=8192 (MiB, --mem)";
  job.unreadable = {"/sys/fs/cgroup/job/memory.max (\"lots\")"};
  std::string why;
  EXPECT_EQ(
      memory::host_budget_bytes("auto", job, 2, false, -1, &why),
      static_cast<int64_t>((8 * kGiB - 8 * kGiB / 20) / 2));
  EXPECT_EQ(
      why,
      "auto: 8.0 GiB (SLURM_MEM_PER_NODE=8192 (MiB, --mem)) less a margin "
      "of 409.6 MiB, over 2 ranks on this node; not read: "
      "/sys/fs/cgroup/job/memory.max (\"lots\")");
}

// This process's own: at most the machine's memory, and a source.
TEST(JobMemory, ThisProcess) {
  const JobMemory job = job_memory();
  EXPECT_GT(job.bytes, 0u);
  EXPECT_LE(job.bytes, total_host_memory());
  EXPECT_FALSE(job.source.empty());
}

}  // namespace
}  // namespace memtrain
