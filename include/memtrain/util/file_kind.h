#pragma once
// What kind of file a path is, in words, for messages that refuse a path
// which is not a regular file ("a FIFO", "a directory", ...).

#include <sys/types.h>

#include <string>

namespace memtrain {

// "a directory", "a FIFO", "a socket", "a character device", "a block
// device", "a symbolic link", "a regular file", or "a special file".
std::string file_kind(mode_t mode);

}  // namespace memtrain
