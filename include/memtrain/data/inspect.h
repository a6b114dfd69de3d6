#pragma once
// `memtrain inspect`: what an HDF5 file holds and whether memtrain can train
// on it.

#include <string>

namespace memtrain {

struct InspectReport {
  std::string text;  // human-readable: layout, shapes, dtypes, chunks, labels
  bool ok = false;   // false when the file does not match data/FORMAT.md
};

InspectReport inspect_file(const std::string& path);

}  // namespace memtrain
