#include "memtrain/util/error.h"

#include "memtrain/util/clock.h"

#include <unistd.h>

#include <cstdio>
#include <sstream>

namespace memtrain {

std::string host_name() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return host;
}

void throw_library_error(
    int rank,
    const char* call,
    const char* file,
    int line,
    const std::string& message) {
  throw Error(detail::concat(
      "[rank ",
      rank,
      ", ",
      host_name(),
      "] ",
      call,
      " failed at ",
      file,
      ":",
      line,
      ": ",
      message));
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos)
    return "";
  const size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, ','))
    out.push_back(trim(cur));
  if (!s.empty() && s.back() == ',')
    out.push_back("");
  return out;
}

std::string format_bytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 6) {
    bytes /= 1024.0;
    ++unit;
  }
  char buf[64];
  std::snprintf(
      buf, sizeof(buf), unit == 0 ? "%.0f %s" : "%.1f %s", bytes, kUnits[unit]);
  return buf;
}

}  // namespace memtrain
