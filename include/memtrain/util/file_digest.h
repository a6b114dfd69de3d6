#pragma once

#include <string>

namespace memtrain {

// A cheap identity of a file's contents, to tell whether the copies that
// ranks on different hosts open are the same file: its size and an FNV-1a
// digest of up to 64 blocks of 64 KiB spread evenly over it (the first and
// the last included; the whole file when it is smaller than 4 MiB), as
// "N bytes, digest HEX". Reads at most 4 MiB whatever the size: copies
// that differ only between the sampled blocks pass; with whole = true every
// block is read. Throws memtrain::Error
// naming the file when it cannot be read or is not a regular file (never
// opened then: a FIFO would block).
std::string file_digest(const std::string& path, bool whole = false);

}  // namespace memtrain
