#include "memtrain/util/host_memory.h"

#include <unistd.h>

#include <cstdio>

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

}  // namespace memtrain
