#include "memtrain/train/metrics.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>

#include "memtrain/util/error.h"

namespace memtrain {

MetricsLog::MetricsLog(const std::string& path, bool append) : path_(path) {
  if (path.empty())
    return;
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  MT_CHECK(
      file_ != nullptr,
      "cannot open '",
      path,
      "' for writing: ",
      std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (file_)
    std::fclose(file_);
}

void MetricsLog::write(const nlohmann::json& record) {
  if (!file_)
    return;
  const std::string line = record.dump() + "\n";
  MT_CHECK(
      std::fwrite(line.data(), 1, line.size(), file_) == line.size() &&
          std::fflush(file_) == 0,
      "cannot write '",
      path_,
      "': ",
      std::strerror(errno));
}

}  // namespace memtrain
