#include "memtrain/util/gzip_file.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "memtrain/util/error.h"

namespace memtrain {
namespace {

constexpr const char* kRemedy =
    ": the file is damaged; re-export or re-download it";

struct FileClose {
  void operator()(std::FILE* f) const {
    std::fclose(f);
  }
};

struct Inflate {
  z_stream zs{};
  bool open = false;
  ~Inflate() {
    if (open)
      inflateEnd(&zs);
  }
};

// What follows the last member at byte `end` of a file of `size` bytes.
std::string trailing(uint64_t end, uint64_t size, const std::string& why) {
  return ": its " + std::to_string(size - end) +
         " bytes after the end of the gzip stream (at byte " +
         std::to_string(end) + ") are not a gzip member (trailing garbage" +
         why + ")" + kRemedy;
}

std::string member_str(uint64_t member) {
  return member > 1 ? " (member " + std::to_string(member) + " of the stream)"
                    : "";
}

}  // namespace

bool has_gzip_magic(const std::string& path) {
  std::unique_ptr<std::FILE, FileClose> f(std::fopen(path.c_str(), "rb"));
  unsigned char b[2] = {0, 0};
  return f && std::fread(b, 1, 2, f.get()) == 2 && b[0] == 0x1f && b[1] == 0x8b;
}

void read_gzip_file(
    const std::string& path, const std::string& who, const GzipSink& sink) {
  std::unique_ptr<std::FILE, FileClose> f(std::fopen(path.c_str(), "rb"));
  struct stat st {};
  if (!f || ::fstat(fileno(f.get()), &st) != 0)
    throw Error(who + ": cannot read (" + std::strerror(errno) + ")");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  Inflate z;
  // 15 + 16: a gzip member (header, deflate data, CRC-32 and ISIZE checked
  // by inflate itself when it reaches the trailer).
  MT_INTERNAL_ASSERT(inflateInit2(&z.zs, 15 + 16) == Z_OK, "inflateInit2");
  z.open = true;
  std::vector<unsigned char> in(size_t{1} << 16), out(size_t{1} << 18);
  uint64_t read = 0;     // bytes of the file read so far
  uint64_t member = 1;   // the member being inflated (1-based)
  bool between = false;  // after a member's trailer, before the next
  bool member_out = false;
  bool padding = false;  // zero bytes seen after the last member
  uint64_t end = 0;      // where the last whole member ended
  for (;;) {
    if (z.zs.avail_in == 0) {
      const size_t got = std::fread(in.data(), 1, in.size(), f.get());
      if (got == 0 && std::ferror(f.get()))
        throw Error(who + ": cannot read (" + std::strerror(errno) + ")");
      read += got;
      z.zs.next_in = in.data();
      z.zs.avail_in = static_cast<uInt>(got);
      if (got == 0) {
        if (between)
          return;  // the end, after a whole member
        throw Error(
            who + ": the gzip stream ends early" + member_str(member) +
            ", a truncated file" + kRemedy);
      }
    }
    if (between) {
      // Zero padding to the end is skipped; a next member starts with the
      // magic, right after the last (gzread stops at anything else);
      // anything else is not gzip.
      while (z.zs.avail_in > 0 && z.zs.next_in[0] == 0) {
        ++z.zs.next_in;
        --z.zs.avail_in;
        padding = true;
      }
      if (z.zs.avail_in == 0)
        continue;  // more zeros, or the end
      if (padding || z.zs.next_in[0] != 0x1f)
        throw Error(who + trailing(end, size, ""));
      MT_INTERNAL_ASSERT(inflateReset(&z.zs) == Z_OK, "inflateReset");
      between = false;
      member_out = false;
      ++member;
    }
    z.zs.next_out = out.data();
    z.zs.avail_out = static_cast<uInt>(out.size());
    const int r = inflate(&z.zs, Z_NO_FLUSH);
    const size_t made = out.size() - z.zs.avail_out;
    if (made > 0) {
      member_out = true;
      if (sink)
        sink(out.data(), made);
    }
    if (r == Z_STREAM_END) {
      between = true;
      end = read - z.zs.avail_in;
      continue;
    }
    if (r == Z_OK || (r == Z_BUF_ERROR && z.zs.avail_in == 0))
      continue;
    if (r == Z_MEM_ERROR)
      throw std::bad_alloc();
    const std::string msg = z.zs.msg ? z.zs.msg : "error " + std::to_string(r);
    if (msg == "incorrect data check") {
      throw Error(
          who + ": the gzip stream's CRC-32 does not match its data" +
          member_str(member) + kRemedy);
    }
    if (msg == "incorrect length check") {
      throw Error(
          who + ": the gzip stream's length (ISIZE) does not match its data's" +
          member_str(member) + kRemedy);
    }
    if (member > 1 && !member_out && msg == "incorrect header check")
      throw Error(who + trailing(end, size, "; zlib: " + msg));
    throw Error(
        who + ": the gzip stream is corrupt (" +
        (member > 1 ? "member " + std::to_string(member) + " of the stream; "
                    : "") +
        "zlib: " + msg + ")" + kRemedy);
  }
}

}  // namespace memtrain
