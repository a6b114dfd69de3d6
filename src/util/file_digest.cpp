#include "memtrain/util/file_digest.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "memtrain/util/error.h"
#include "memtrain/util/file_kind.h"
#include "memtrain/util/fnv.h"

namespace memtrain {

std::string file_digest(const std::string& path, bool whole) {
  // Never opened when it is not a regular file (a FIFO would block).
  const std::string why = not_a_regular_file(path);
  MT_CHECK(why.empty(), "cannot read '", path, "': ", why);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  MT_CHECK(f, "cannot open '", path, "': ", std::strerror(errno));
  constexpr long long kBlock = 64 * 1024;
  constexpr long long kBlocks = 64;
  std::fseek(f, 0, SEEK_END);
  const long long size = std::ftell(f);
  std::vector<unsigned char> buf(static_cast<size_t>(kBlock));
  uint64_t h = fnv1a(kFnvOffset, &size, sizeof size);
  const long long blocks = (size + kBlock - 1) / kBlock;
  const long long taken = whole || blocks < kBlocks ? blocks : kBlocks;
  bool ok = size >= 0;
  for (long long i = 0; ok && i < taken; ++i) {
    // Block i of `taken`, evenly spaced from the first to the last block.
    const long long b = taken > 1 ? i * (blocks - 1) / (taken - 1) : 0;
    const long long at = b * kBlock;
    const size_t want =
        static_cast<size_t>(size - at < kBlock ? size - at : kBlock);
    ok = std::fseek(f, static_cast<long>(at), SEEK_SET) == 0 &&
         std::fread(buf.data(), 1, want, f) == want;
    h = fnv1a(h, buf.data(), want);
  }
  const int err = errno;
  std::fclose(f);
  MT_CHECK(ok, "cannot read '", path, "': ", std::strerror(err));
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return detail::concat(size, " bytes, digest ", hex);
}

}  // namespace memtrain
