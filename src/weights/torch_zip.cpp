#include "weights/torch_zip.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "memtrain/util/error.h"

namespace memtrain {
namespace {

constexpr uint32_t kEndSig = 0x06054b50;       // end of central directory
constexpr uint32_t kZip64EndSig = 0x06064b50;  // ZIP64 end record
constexpr uint32_t kZip64LocSig = 0x07064b50;  // ZIP64 end locator
constexpr uint32_t kEntrySig = 0x02014b50;     // central directory entry
constexpr size_t kEndSize = 22, kZip64LocSize = 20, kZip64EndSize = 56;
constexpr size_t kEntrySize = 46;

uint64_t le(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i)
    v = v << 8 | p[i];
  return v;
}

std::string lower(std::string s) {
  for (char& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof(b), "0x%08x", v);
  return b;
}

class Directory {
 public:
  explicit Directory(const std::string& path)
      : path_(path), in_(path, std::ios::binary) {
    in_.seekg(0, std::ios::end);
    size_ = in_ ? static_cast<uint64_t>(in_.tellg()) : 0;
  }

  // name (lower case) -> entry, and the first entry's folder.
  template <typename Entry>
  std::unordered_map<std::string, Entry> read(std::string* folder) {
    // The end record: the last signature in the final 22 + 65535 bytes
    // (its comment at most 65535), as miniz finds it.
    const uint64_t tail = std::min<uint64_t>(size_, kEndSize + 65535);
    const std::vector<unsigned char> t = bytes(size_ - tail, tail, "its end");
    uint64_t end = UINT64_MAX;
    for (uint64_t i = tail >= kEndSize ? tail - kEndSize + 1 : 0; i-- > 0;) {
      if (le(&t[i], 4) == kEndSig) {
        end = size_ - tail + i;
        break;
      }
    }
    check(end != UINT64_MAX, "no end of central directory record");
    const unsigned char* e = &t[end - (size_ - tail)];
    check(le(e + 4, 2) == 0 && le(e + 6, 2) == 0, "a multi-disk archive");
    uint64_t count = le(e + 10, 2);
    uint64_t cd_size = le(e + 12, 4), cd_at = le(e + 16, 4);
    uint64_t cd_end = end;  // the directory ends before the end records
    // A ZIP64 end locator before the end record: its record's values are
    // the ones (as miniz takes them; torch.save always writes one).
    const bool saturated =
        count == 0xFFFF || cd_size == 0xFFFFFFFF || cd_at == 0xFFFFFFFF;
    const auto loc = end >= kZip64LocSize
                         ? bytes(end - kZip64LocSize, kZip64LocSize, "ZIP64")
                         : std::vector<unsigned char>();
    if (!loc.empty() && le(loc.data(), 4) == kZip64LocSig) {
      const uint64_t at = le(&loc[8], 8);
      check(
          at <= end - kZip64LocSize &&
              end - kZip64LocSize - at >= kZip64EndSize,
          "the ZIP64 end record is outside the file");
      const auto z = bytes(at, kZip64EndSize, "ZIP64");
      check(le(z.data(), 4) == kZip64EndSig, "no ZIP64 end record");
      check(le(&z[16], 4) == 0 && le(&z[20], 4) == 0, "a multi-disk archive");
      count = le(&z[32], 8);
      cd_size = le(&z[40], 8);
      cd_at = le(&z[48], 8);
      cd_end = at;
    } else {
      check(!saturated, "no ZIP64 end locator");
    }
    check(
        cd_at <= cd_end && cd_size <= cd_end - cd_at,
        "the central directory (" + std::to_string(cd_size) + " bytes at " +
            std::to_string(cd_at) + ") is outside the file");
    check(count > 0, "no entries");
    check(
        count <= cd_size / kEntrySize,
        std::to_string(count) + " entries cannot fit in its " +
            std::to_string(cd_size) + " bytes");
    const std::vector<unsigned char> cd = bytes(cd_at, cd_size, "directory");
    std::unordered_map<std::string, Entry> out;
    size_t p = 0;
    for (uint64_t i = 0; i < count; ++i) {
      const std::string where = "entry " + std::to_string(i);
      check(
          cd.size() - p >= kEntrySize && le(&cd[p], 4) == kEntrySig,
          where + " is not a central directory entry");
      const unsigned char* h = &cd[p];
      const size_t name_len = le(h + 28, 2), extra_len = le(h + 30, 2),
                   comment_len = le(h + 32, 2);
      check(
          cd.size() - p - kEntrySize >= name_len + extra_len + comment_len,
          where + " runs past the directory's end");
      Entry en;
      en.name.assign(reinterpret_cast<const char*>(h + kEntrySize), name_len);
      en.crc = static_cast<uint32_t>(le(h + 16, 4));
      en.size = le(h + 24, 4);
      if (en.size == 0xFFFFFFFF) {  // in the ZIP64 extra field (id 1)
        bool found = false;
        const unsigned char* x = h + kEntrySize + name_len;
        for (size_t q = 0; q + 4 <= extra_len;) {
          const size_t id = le(x + q, 2), n = le(x + q + 2, 2);
          check(q + 4 + n <= extra_len, where + "'s extra field is malformed");
          if (id == 1 && n >= 8) {
            en.size = le(x + q + 4, 8);
            found = true;
          }
          q += 4 + n;
        }
        check(found, where + " has no ZIP64 size");
      }
      if (i == 0) {
        const size_t slash = en.name.find('/');
        check(slash != std::string::npos, "its first entry has no folder");
        *folder = en.name.substr(0, slash + 1);
      }
      const std::string key = lower(en.name);
      check(out.count(key) == 0, "it names '" + en.name + "' twice");
      out.emplace(key, std::move(en));
      p += kEntrySize + name_len + extra_len + comment_len;
    }
    return out;
  }

 private:
  void check(bool ok, const std::string& what) const {
    if (!ok) {
      throw Error(
          "'" + path_ + "': its zip central directory is malformed (" + what +
          "): not a torch.save file memtrain can read; save it again with "
          "torch.save or re-download it");
    }
  }

  std::vector<unsigned char> bytes(
      uint64_t at, uint64_t n, const std::string& what) {
    check(at <= size_ && n <= size_ - at, what + " is outside the file");
    std::vector<unsigned char> b(n);
    in_.clear();
    in_.seekg(static_cast<std::streamoff>(at));
    check(
        static_cast<bool>(in_.read(
            reinterpret_cast<char*>(b.data()),
            static_cast<std::streamsize>(n))),
        "cannot read " + what);
    return b;
  }

  std::string path_;
  std::ifstream in_;
  uint64_t size_ = 0;
};

}  // namespace

TorchZip::TorchZip(const std::string& path)
    : path_(path),
      entries_(Directory(path).read<Entry>(&folder_)),
      zip_(path) {}

bool TorchZip::has(const std::string& name) {
  return zip_.hasRecord(name);
}

std::tuple<at::DataPtr, size_t> TorchZip::get(const std::string& name) {
  auto record = zip_.getRecord(name);
  const auto it = entries_.find(lower(folder_ + name));
  MT_CHECK(
      it != entries_.end(),
      "'",
      path_,
      "': zip record ",
      folder_,
      name,
      " was read but is not in its central directory: a damaged file; save "
      "it again with torch.save or re-download it");
  const Entry& e = it->second;
  const auto* p = static_cast<const unsigned char*>(std::get<0>(record).get());
  const size_t n = std::get<1>(record);
  uint32_t crc = static_cast<uint32_t>(crc32_z(0, Z_NULL, 0));
  if (n > 0)
    crc = static_cast<uint32_t>(crc32_z(crc, p, n));
  if (crc != e.crc || n != e.size) {
    throw Error(
        "'" + path_ + "': zip record " + e.name +
        " does not match its CRC-32 in the archive's central directory (" +
        hex32(e.crc) + ", " + std::to_string(e.size) + " bytes; its " +
        std::to_string(n) + " bytes give " + hex32(crc) +
        "): the file is damaged; save it again with torch.save or "
        "re-download it");
  }
  return record;
}

}  // namespace memtrain
