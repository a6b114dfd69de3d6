#include "memtrain/util/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "memtrain/util/error.h"

namespace memtrain {
namespace {

std::string parent_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos)
    return ".";
  if (slash == 0)
    return "/";
  return path.substr(0, slash);
}

}  // namespace

void write_file_atomically(
    const std::string& path,
    const std::function<void(const std::function<void(const void*, size_t)>&)>&
        write) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  MT_CHECK(
      fd >= 0,
      "cannot create '",
      tmp,
      "': ",
      std::strerror(errno),
      " (is the folder writable?)");
  auto fail = [&](const std::string& what) {
    const std::string reason = std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(
        "cannot " + what + " '" + tmp + "': " + reason + " ('" + path +
        "' is unchanged)");
  };
  try {
    write([&](const void* data, size_t size) {
      const char* p = static_cast<const char*>(data);
      while (size > 0) {
        const ssize_t n = ::write(fd, p, size);
        if (n < 0 && errno == EINTR)
          continue;
        if (n <= 0)
          fail("write");
        p += n;
        size -= static_cast<size_t>(n);
      }
    });
  } catch (const Error&) {
    throw;
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::fsync(fd) != 0)
    fail("fsync");
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw Error("cannot close '" + tmp + "': " + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error("cannot rename '" + tmp + "' to '" + path + "': " + reason);
  }
  const int dir = ::open(parent_of(path).c_str(), O_RDONLY | O_DIRECTORY);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

void write_file_atomically(const std::string& path, const std::string& data) {
  write_file_atomically(
      path, [&](const auto& sink) { sink(data.data(), data.size()); });
}

void make_directories(const std::string& path) {
  MT_CHECK(!path.empty(), "empty folder name");
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    partial = path.substr(0, pos);
    if (partial.empty())
      continue;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      throw Error(
          "cannot create folder '" + partial + "': " + std::strerror(errno));
    }
  }
  struct stat st {};
  MT_CHECK(
      ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode),
      "'",
      path,
      "' exists and is not a folder");
  MT_CHECK(
      ::access(path.c_str(), W_OK) == 0, "folder '", path, "' is not writable");
}

}  // namespace memtrain
