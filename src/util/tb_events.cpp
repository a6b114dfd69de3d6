#include "memtrain/util/tb_events.h"

#include <dirent.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "memtrain/util/atomic_file.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

// Protobuf wire format: key = field << 3 | wire type; 0 varint, 1 64-bit,
// 2 length-delimited, 5 32-bit; little-endian fixed fields.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

template <typename T>
void fixed(std::string& out, T v) {
  unsigned char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // x86-64 and aarch64: little-endian
  out.append(reinterpret_cast<const char*>(b), sizeof(T));
}

void key(std::string& out, int field, int wire) {
  varint(out, static_cast<uint64_t>(field) << 3 | wire);
}

void bytes_field(std::string& out, int field, const std::string& v) {
  key(out, field, 2);
  varint(out, v.size());
  out += v;
}

// Event: wall_time 1 (double), step 2 (int64), file_version 3,
// summary 5, session_log 7.
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  key(e, 1, 1);
  fixed(e, wall_time);
  if (step != 0) {
    key(e, 2, 0);
    varint(e, static_cast<uint64_t>(step));
  }
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i)
    c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

namespace tb {

std::string file_version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  bytes_field(e, 3, "brain.Event:2");
  return e;
}

std::string scalars_event(double wall_time, int64_t step, const Scalars& s) {
  // Summary { repeated Value value = 1 }; Value { tag 1, simple_value 2 }.
  std::string summary;
  for (const auto& [tag, v] : s) {
    std::string value;
    bytes_field(value, 1, tag);
    key(value, 2, 5);
    fixed(value, v);
    bytes_field(summary, 1, value);
  }
  std::string e = event_head(wall_time, step);
  bytes_field(e, 5, summary);
  return e;
}

std::string session_start_event(double wall_time, int64_t step) {
  std::string log;  // SessionLog { status 1: START = 1 }
  key(log, 1, 0);
  varint(log, 1);
  std::string e = event_head(wall_time, step);
  bytes_field(e, 7, log);
  return e;
}

std::string record(const std::string& data) {
  std::string r;
  const uint64_t n = data.size();
  fixed(r, n);
  fixed(r, masked_crc32c(r.data(), 8));
  r += data;
  fixed(r, masked_crc32c(data.data(), data.size()));
  return r;
}

double wall_time_now() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

EventWriter::EventWriter(const std::string& dir) {
  make_directories(dir);
  int last = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* ent = ::readdir(d)) {
      const std::string name = ent->d_name;
      const auto at = name.rfind(".memtrain.");
      if (name.rfind("events.out.tfevents.", 0) == 0 && at != std::string::npos)
        last = std::max(last, std::atoi(name.c_str() + at + 10));
    }
    ::closedir(d);
  }
  const double now = wall_time_now();
  char name[96];
  std::snprintf(
      name,
      sizeof name,
      "/events.out.tfevents.%010lld.memtrain.%04d",
      static_cast<long long>(now),
      last + 1);
  path_ = dir + name;
  file_ = std::fopen(path_.c_str(), "wb");
  MT_CHECK(
      file_ != nullptr, "cannot create '", path_, "': ", std::strerror(errno));
  write(file_version_event(now));
}

EventWriter::~EventWriter() {
  if (file_)
    std::fclose(file_);
}

void EventWriter::scalars(int64_t step, const Scalars& s) {
  if (!s.empty())
    write(scalars_event(wall_time_now(), step, s));
}

void EventWriter::session_start(int64_t step) {
  write(session_start_event(wall_time_now(), step));
}

void EventWriter::write(const std::string& event) {
  const std::string r = record(event);
  MT_CHECK(
      std::fwrite(r.data(), 1, r.size(), file_) == r.size() &&
          std::fflush(file_) == 0,
      "cannot write '",
      path_,
      "': ",
      std::strerror(errno));
}

}  // namespace tb
}  // namespace memtrain
