#pragma once
// The per-rank log, output.dir/rank-N.log: what this rank did and saw
// (start, plan, resume, OOM replays, stop requests, errors, the end), one
// timestamped line each, flushed at once so it survives a crash.

#include <string>

namespace memtrain {

// Opens (appends to) `path`; throws memtrain::Error if it cannot.
void open_rank_log(const std::string& path);

// Writes one line to the rank log (if open); with `echo`, also to stderr.
void log_event(const std::string& line, bool echo = false);

}  // namespace memtrain
