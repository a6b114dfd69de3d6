#pragma once
// TensorBoard event files, written without TensorFlow or a protobuf library
// (Note [Event files] in ARCHITECTURE.md). A file is a sequence of TFRecords
//   uint64 length | uint32 masked CRC32C(length) | data | uint32 masked
//   CRC32C(data)   (little-endian)
// around protobuf-encoded tensorflow.Event messages: first
// {wall_time, file_version: "brain.Event:2"}, then events
// {wall_time, step, summary {value {tag, simple_value}}...} and
// {wall_time, step, session_log {status: START}} (where a run starts).

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace memtrain {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78).
uint32_t crc32c(const void* data, size_t size);
// TFRecord's mask: rotate right by 15, add 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t size);

namespace tb {

using Scalars = std::vector<std::pair<std::string, float>>;

// Encoded Event messages (the protobuf bytes, no framing).
std::string file_version_event(double wall_time);
std::string scalars_event(double wall_time, int64_t step, const Scalars& s);
// SessionLog{status: START} at `step`: TensorBoard drops the points of
// every tag at steps >= `step` read before it (a run resumed from an earlier
// checkpoint starts a new timeline there).
std::string session_start_event(double wall_time, int64_t step);

// The TFRecord around `data`.
std::string record(const std::string& data);

// Seconds since the epoch (Event.wall_time).
double wall_time_now();

// One events file; every record is flushed as it is written, so a crash
// leaves the earlier ones readable.
class EventWriter {
 public:
  // Creates `dir` and a new file in it named
  // events.out.tfevents.<seconds, 10 digits>.memtrain.<n, 4 digits>, n one
  // more than any events file there: names sort in the order runs started
  // (TensorBoard reads a folder's files by name). Writes file_version.
  // Throws memtrain::Error when it cannot.
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  void scalars(int64_t step, const Scalars& s);
  void session_start(int64_t step);
  const std::string& path() const {
    return path_;
  }

 private:
  void write(const std::string& event);
  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace tb
}  // namespace memtrain
