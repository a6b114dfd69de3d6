#pragma once
// Writing a file so that a crash at any instant leaves either the old file or
// the complete new one: write a temporary file beside it, fsync it, rename it
// over the target, fsync the folder.

#include <functional>
#include <string>

namespace memtrain {

// Calls `write(sink)` where sink(data, size) appends bytes, then publishes
// the file at `path`. Throws memtrain::Error naming the path on any failure
// (the temporary file is removed; `path` is untouched).
void write_file_atomically(
    const std::string& path,
    const std::function<void(const std::function<void(const void*, size_t)>&)>&
        write);

// The same for a string.
void write_file_atomically(const std::string& path, const std::string& data);

// mkdir -p; throws memtrain::Error naming the folder and the reason.
void make_directories(const std::string& path);
// make_directories of the folder `path` is in ("out/x.h5": "out"; nothing
// for a bare file name).
void make_parent_directories(const std::string& path);

}  // namespace memtrain
