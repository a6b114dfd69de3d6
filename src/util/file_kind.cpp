#include "memtrain/util/file_kind.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace memtrain {

std::string file_kind(mode_t mode) {
  if (S_ISREG(mode))
    return "a regular file";
  if (S_ISDIR(mode))
    return "a directory";
  if (S_ISFIFO(mode))
    return "a FIFO";
  if (S_ISSOCK(mode))
    return "a socket";
  if (S_ISCHR(mode))
    return "a character device";
  if (S_ISBLK(mode))
    return "a block device";
  if (S_ISLNK(mode))
    return "a symbolic link";
  return "a special file";
}

std::string not_a_regular_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    return S_ISREG(st.st_mode) ? ""
                               : file_kind(st.st_mode) + ", not a regular file";
  }
  const int err = errno;
  struct stat link {};
  const bool is_link =
      ::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode);
  if (err == ELOOP)
    return "a symbolic link loop (" + std::string(std::strerror(err)) + ")";
  if (err == ENOENT && is_link)
    return "a broken symbolic link (its target does not exist)";
  if (err == ENOENT)
    return "no such file";
  return "cannot stat: " + std::string(std::strerror(err));
}

}  // namespace memtrain
