#pragma once
// Private to the library: the converters' guard for temporary output files
// (convert-nifti, convert-images, convert-dataset, convert-captions,
// embed). Each path still in `paths` when the guard is destroyed is
// removed; publish() renames one over its output and clears its entry.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "memtrain/util/error.h"

namespace memtrain {

struct TempFiles {
  std::vector<std::string> paths;
  // Renames paths[i] to `out`; throws memtrain::Error "COMMAND: cannot
  // move 'TMP' to 'OUT': REASON" (the temporary file is then still
  // removed by the destructor).
  void publish(size_t i, const std::string& out, const std::string& command) {
    if (std::rename(paths[i].c_str(), out.c_str()) != 0) {
      throw Error(
          command + ": cannot move '" + paths[i] + "' to '" + out +
          "': " + std::strerror(errno));
    }
    paths[i].clear();  // published: nothing to remove
  }
  ~TempFiles() {
    for (const auto& p : paths)
      if (!p.empty())
        std::remove(p.c_str());
  }
};

}  // namespace memtrain
