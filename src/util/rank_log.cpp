#include "memtrain/util/rank_log.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>

#include "memtrain/util/error.h"

namespace memtrain {
namespace {
std::mutex g_mu;
std::FILE* g_log = nullptr;
}  // namespace

void open_rank_log(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_log)
    std::fclose(g_log);
  g_log = std::fopen(path.c_str(), "a");
  MT_CHECK(
      g_log != nullptr,
      "cannot open the rank log '",
      path,
      "': ",
      std::strerror(errno));
}

void log_event(const std::string& line, bool echo) {
  if (echo) {
    std::fprintf(stderr, "memtrain: %s\n", line.c_str());
    std::fflush(stderr);
  }
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_log)
    return;
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", std::gmtime(&now));
  std::fprintf(g_log, "%sZ %s\n", stamp, line.c_str());
  std::fflush(g_log);
}

}  // namespace memtrain
