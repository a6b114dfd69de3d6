#pragma once
// The records of a torch.save archive (a zip file), each checked against
// the CRC-32 its zip central directory gives. PyTorch reads the archive
// with miniz built with MINIZ_DISABLE_ZIP_READER_CRC32_CHECKS (LibTorch
// 1.13 and 2.11 alike), so a record whose bytes were damaged reads without
// an error; memtrain reads the central directory itself (a small bounded
// parser: the end record, ZIP64's, each entry's name, CRC-32 and size) and
// compares. Private to src/weights/ (torch_file.cpp).

#include <caffe2/serialize/inline_container.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <unordered_map>

namespace memtrain {

class TorchZip {
 public:
  // Reads the central directory of `path`, refusing a malformed one
  // (memtrain::Error naming the file and what is wrong), then opens the
  // archive with PyTorch's reader (its c10::Error passes through).
  explicit TorchZip(const std::string& path);

  bool has(const std::string& name);
  // Record `name` (as PyTorchStreamReader names it: under the archive's
  // folder), refused when its bytes do not give the CRC-32 or the size the
  // central directory has for it: memtrain::Error "'PATH': zip record
  // archive/data/3 does not match its CRC-32 ...". Only the API LibTorch
  // 1.13 and 2.11 share is used (getRecord(name), hasRecord).
  std::tuple<at::DataPtr, size_t> get(const std::string& name);

 private:
  struct Entry {
    std::string name;  // as stored
    uint32_t crc = 0;
    uint64_t size = 0;  // uncompressed
  };
  std::string path_;
  std::string folder_;  // the first entry's folder, "archive/": every name's
  std::unordered_map<std::string, Entry> entries_;  // by lower-case name
  caffe2::serialize::PyTorchStreamReader zip_;
};

}  // namespace memtrain
