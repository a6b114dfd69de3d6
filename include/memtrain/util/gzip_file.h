#pragma once
// Reading a gzip file whole, with every check its format has. zlib checks a
// member's CRC-32 and length (ISIZE) only when inflate reaches the member's
// trailer; a reader that stops once it has the bytes it needs (libnifti's
// znzlib on a .nii.gz) never gets there, and a damaged stream that still
// inflates gives wrong bytes without an error.

#include <cstddef>
#include <functional>
#include <string>

namespace memtrain {

// What read_gzip_file passes its bytes to, in order, in pieces.
using GzipSink = std::function<void(const unsigned char* p, size_t n)>;

// True when `path` starts with the gzip magic bytes 1f 8b.
bool has_gzip_magic(const std::string& path);

// Inflates the gzip file `path` to its end, passing the bytes to `sink`
// (when set). Each member (RFC 1952; a file may hold several, as `cat a.gz
// b.gz` makes, read as one stream, as zlib's gzread reads them) must have a
// valid header and deflate data and end with the CRC-32 and ISIZE of the
// bytes it inflated to; zero bytes after the last member are skipped (as
// Python's gzip skips them), anything else there is refused. Throws
// memtrain::Error "WHO: the gzip stream's CRC-32 does not match ..." (or
// its length, truncation, corrupt data, trailing bytes, a read error),
// ending with what to do: re-export or re-download the file. `who` starts
// the message and names the file.
void read_gzip_file(
    const std::string& path, const std::string& who, const GzipSink& sink);

}  // namespace memtrain
