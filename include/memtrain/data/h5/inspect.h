#pragma once
// `memtrain inspect`: what an HDF5 file holds and whether memtrain can train
// on it.

#include <cstdint>
#include <string>
#include <vector>

namespace memtrain {

struct InspectReport {
  std::string text;  // human-readable: layout, shapes, dtypes, chunks, labels
  bool ok = false;   // false when the file does not match docs/data-format.md
};

InspectReport inspect_file(const std::string& path);

// `memtrain inspect --verify`: reads every chunk of every dataset through
// HDF5's filters, so that every Fletcher32 checksum is checked (Note
// [Checksummed data] in ARCHITECTURE.md).
struct VerifyReport {
  std::string text;                        // one line a finding, then a summary
  int64_t datasets = 0;                    // datasets with checksums, read
  int64_t chunks = 0;                      // their chunks, read
  std::vector<std::string> damaged;        // "'/features' chunk 3 ..."
  std::vector<std::string> unchecksummed;  // datasets without a checksum
  bool opened = false;                     // false: not a readable HDF5 file
  // 0 all verified, 1 nothing damaged but some datasets cannot be verified,
  // 2 damaged chunks or not a readable HDF5 file.
  int exit_status() const;
};

VerifyReport verify_file(const std::string& path);

}  // namespace memtrain
