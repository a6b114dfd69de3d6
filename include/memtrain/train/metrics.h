#pragma once
// MetricsLog: metrics.jsonl, one JSON object a line, each line written whole
// and flushed, so a crash leaves every earlier record readable.

#include <cstdio>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace memtrain {

class MetricsLog {
 public:
  // Truncates and opens `path`; an empty path makes a log that drops records
  // (ranks other than 0). Throws memtrain::Error if it cannot open.
  explicit MetricsLog(const std::string& path, bool append = false);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  void write(const nlohmann::json& record);

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace memtrain
