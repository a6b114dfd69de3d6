#pragma once
// Private to src/data/: the converters' guard for temporary output files
// (convert-nifti, convert-images). Each path still in `paths` when the
// guard is destroyed is removed; a published file's entry is cleared
// (set to "") after its rename.
#include <cstdio>
#include <string>
#include <vector>

namespace memtrain {

struct TempFiles {
  std::vector<std::string> paths;
  ~TempFiles() {
    for (const auto& p : paths)
      if (!p.empty())
        std::remove(p.c_str());
  }
};

}  // namespace memtrain
