#include "memtrain/util/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "memtrain/util/error.h"

namespace memtrain {

uint64_t available_host_memory() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f != nullptr) {
    char line[256];
    unsigned long long kb = 0;
    bool found = false;
    while (!found && std::fgets(line, sizeof(line), f) != nullptr)
      found = std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
    std::fclose(f);
    if (found)
      return static_cast<uint64_t>(kb) * 1024;
  }
  const long pages = ::sysconf(_SC_AVPHYS_PAGES);
  const long size = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0
             ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(size)
             : 0;
}

uint64_t total_host_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long size = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0
             ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(size)
             : 0;
}

namespace {

// A limit file's reading: absent or "max" is no limit (0); a file that is
// there but holds no number is named in `unreadable`.
uint64_t read_limit(
    const std::string& path, std::vector<std::string>& unreadable) {
  std::ifstream in(path);
  if (!in) {
    if (::access(path.c_str(), F_OK) == 0)
      unreadable.push_back(path + " (cannot be opened)");
    return 0;
  }
  std::string text;
  in >> text;
  if (text == "max")
    return 0;
  if (text.empty() || text.size() > 19 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    unreadable.push_back(path + " (\"" + text + "\")");
    return 0;
  }
  return static_cast<uint64_t>(std::stoull(text));
}

// The smallest limit named `file` in `root` + `dir` and its parents; sets
// `where` to its file.
uint64_t smallest_limit(
    const std::string& root,
    std::string dir,
    const std::string& file,
    std::string& where,
    std::vector<std::string>& unreadable) {
  uint64_t least = 0;
  for (;;) {
    const std::string path =
        root + (dir.empty() || dir == "/" ? "" : dir) + "/" + file;
    const uint64_t limit = read_limit(path, unreadable);
    if (limit > 0 && (least == 0 || limit < least)) {
      least = limit;
      where = path;
    }
    if (dir.empty() || dir == "/")
      break;
    const size_t slash = dir.find_last_of('/');
    dir = slash == std::string::npos ? "" : dir.substr(0, slash);
  }
  return least;
}

// A SLURM variable holding MiB (or a count): 0 when unset; throws on a
// value that is not a number.
uint64_t slurm_number(
    const std::function<const char*(const char*)>& getenv, const char* name) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0')
    return 0;
  const std::string text(v);
  MT_CHECK(
      text.find_first_not_of("0123456789") == std::string::npos &&
          text.size() <= 15,
      name,
      "=\"",
      text,
      "\" is not a whole number (SLURM sets it in MiB, or as a count); "
      "unset it or fix the job script that sets it");
  return std::stoull(text);
}

}  // namespace

JobMemory job_memory(
    uint64_t physical,
    const std::string& proc_cgroup,
    const std::string& cgroup_root,
    const std::function<const char*(const char*)>& getenv) {
  JobMemory job;
  const auto take = [&](uint64_t bytes, const std::string& source) {
    if (bytes > 0 && (job.bytes == 0 || bytes < job.bytes)) {
      job.bytes = bytes;
      job.source = source;
    }
  };
  take(physical, "physical memory");
  std::ifstream in(proc_cgroup);
  std::string line;
  while (std::getline(in, line)) {
    // "0::/path" (v2) or "N:controllers:/path" (v1).
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos)
      continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    std::string where;
    if (controllers.empty()) {
      const uint64_t cg = smallest_limit(
          cgroup_root, path, "memory.max", where, job.unreadable);
      take(cg, "cgroup memory.max of " + path + " (" + where + ")");
    } else if (
        ("," + controllers + ",").find(",memory,") != std::string::npos) {
      // v1 reports "no limit" as a number near 2^63: above physical.
      const uint64_t cg = smallest_limit(
          cgroup_root + "/memory",
          path,
          "memory.limit_in_bytes",
          where,
          job.unreadable);
      take(
          cg,
          "cgroup (v1) memory.limit_in_bytes of " + path + " (" + where + ")");
    }
  }
  const uint64_t mib = uint64_t{1} << 20;
  if (const uint64_t node = slurm_number(getenv, "SLURM_MEM_PER_NODE")) {
    take(
        node * mib,
        "SLURM_MEM_PER_NODE=" + std::to_string(node) + " (MiB, --mem)");
  }
  const std::pair<const char*, const char*> per[] = {
      {"SLURM_MEM_PER_CPU", "SLURM_CPUS_ON_NODE"},
      {"SLURM_MEM_PER_GPU", "SLURM_GPUS_ON_NODE"}};
  for (const auto& [each, count_name] : per) {
    const uint64_t m = slurm_number(getenv, each);
    if (m == 0)
      continue;
    const uint64_t n = slurm_number(getenv, count_name);
    if (n == 0) {
      job.unreadable.push_back(
          std::string(each) + " without " + count_name +
          ": this node's share is unknown");
      continue;
    }
    take(
        m * n * mib,
        std::string(each) + "=" + std::to_string(m) + " (MiB) x " + count_name +
            "=" + std::to_string(n));
  }
  return job;
}

JobMemory job_memory() {
  return job_memory(
      total_host_memory(),
      "/proc/self/cgroup",
      "/sys/fs/cgroup",
      [](const char* name) { return std::getenv(name); });
}

uint64_t host_memory_limit() {
  return job_memory().bytes;
}

}  // namespace memtrain
