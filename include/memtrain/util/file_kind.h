#pragma once
// What kind of file a path is, in words, for messages that refuse a path
// which is not a regular file ("a FIFO", "a directory", ...).

#include <sys/types.h>

#include <string>

namespace memtrain {

// "a directory", "a FIFO", "a socket", "a character device", "a block
// device", "a symbolic link", "a regular file", or "a special file".
std::string file_kind(mode_t mode);

// Why `path` is not a regular file to read (following symbolic links), in
// words: "a FIFO, not a regular file", "a symbolic link loop (...)", "a
// broken symbolic link (its target does not exist)", "no such file";
// "" when it is one. Never opens it (a FIFO would block).
std::string not_a_regular_file(const std::string& path);

}  // namespace memtrain
