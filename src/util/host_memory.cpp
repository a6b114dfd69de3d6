#include "memtrain/util/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

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

// The number in `path` ("max" and absent files: no limit, 0).
uint64_t read_limit(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max")
    return 0;
  try {
    return static_cast<uint64_t>(std::stoull(text));
  } catch (const std::exception&) {
    return 0;
  }
}

// The smallest limit named `file` in `dir` and its parents up to `root`.
uint64_t smallest_limit(
    const std::string& root, std::string dir, const std::string& file) {
  uint64_t least = 0;
  for (;;) {
    const uint64_t limit = read_limit(root + dir + "/" + file);
    if (limit > 0 && (least == 0 || limit < least))
      least = limit;
    if (dir.empty() || dir == "/")
      break;
    const size_t slash = dir.find_last_of('/');
    dir = slash == std::string::npos ? "" : dir.substr(0, slash);
  }
  return least;
}

}  // namespace

uint64_t host_memory_limit() {
  uint64_t limit = total_host_memory();
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    // "0::/path" (v2) or "N:controllers:/path" (v1).
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos)
      continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    uint64_t cg = 0;
    if (controllers.empty()) {
      cg = smallest_limit("/sys/fs/cgroup", path, "memory.max");
    } else if (
        ("," + controllers + ",").find(",memory,") != std::string::npos) {
      cg = smallest_limit(
          "/sys/fs/cgroup/memory", path, "memory.limit_in_bytes");
    }
    // v1 reports "no limit" as a number near 2^63.
    if (cg > 0 && (limit == 0 || cg < limit))
      limit = cg;
  }
  return limit;
}

}  // namespace memtrain
