#include "memtrain/util/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>

#include "memtrain/util/error.h"
#include "memtrain/util/temp_path.h"

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

// About when this process started (static initialization).
const time_t kProcessStart = ::time(nullptr);

// The PID in `digits` (decimal, no leading zero), or 0.
pid_t pid_of(const std::string& digits) {
  if (digits.empty() || digits.size() > 9 || digits[0] == '0')
    return 0;
  for (char c : digits)
    if (c < '0' || c > '9')
      return 0;
  return static_cast<pid_t>(std::stol(digits));
}

// The PID of a temporary name, or 0: NAME.tmp.PID (NAME not empty), or
// predict's .tmpPID-NAME.nii[.gz] (its NIfTI library needs the extension
// last).
pid_t temp_pid(const std::string& name) {
  if (name.compare(0, 4, ".tmp") == 0) {
    const size_t dash = name.find('-');
    const bool nii =
        name.size() > 4 &&
        (name.compare(name.size() - 4, 4, ".nii") == 0 ||
         (name.size() > 7 && name.compare(name.size() - 7, 7, ".nii.gz") == 0));
    if (dash != std::string::npos && dash + 1 < name.size() && nii)
      return pid_of(name.substr(4, dash - 4));
  }
  const size_t at = name.rfind(".tmp.");
  if (at == std::string::npos || at == 0)
    return 0;
  return pid_of(name.substr(at + 5));
}

}  // namespace

std::string temp_path_for(const std::string& path) {
  return path + ".tmp." + std::to_string(::getpid());
}

std::vector<std::string> remove_stale_temp_files(const std::string& path) {
  std::vector<std::string> removed;
  const std::string folder = parent_of(path);
  {
    // A folder is looked at again a minute after the last look: a file
    // too young the first time (its writer killed just before this
    // process started) goes at a later write of this run.
    static std::mutex mu;
    static std::map<std::string, time_t> looked;
    std::lock_guard<std::mutex> lock(mu);
    const time_t now = ::time(nullptr);
    auto it = looked.find(folder);
    if (it != looked.end() && now - it->second < 60)
      return removed;
    looked[folder] = now;
  }
  DIR* dir = ::opendir(folder.c_str());
  if (!dir)
    return removed;
  while (const dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    const pid_t pid = temp_pid(name);
    if (pid <= 0 || pid == ::getpid())
      continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH)
      continue;  // alive (or not ours to signal: EPERM means it runs)
    const std::string file = folder + "/" + name;
    struct stat st {};
    if (::lstat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      continue;
    // A PID is only known on its own host: a peer rank of this job on
    // another node, writing into a shared folder, has a PID this host does
    // not run. Its file is younger than this process; a killed writer's is
    // from before it started (a minute's margin for the job's start).
    if (st.st_mtime >= kProcessStart - 60)
      continue;
    if (::unlink(file.c_str()) != 0)
      continue;
    std::fprintf(
        stderr,
        "memtrain: removed stale temporary file '%s' (its writer, process "
        "%d, no longer runs)\n",
        file.c_str(),
        static_cast<int>(pid));
    removed.push_back(file);
  }
  ::closedir(dir);
  return removed;
}

void write_file_atomically(
    const std::string& path,
    const std::function<void(const std::function<void(const void*, size_t)>&)>&
        write) {
  remove_stale_temp_files(path);
  const std::string tmp = temp_path_for(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  MT_CHECK(
      fd >= 0,
      "cannot create '",
      tmp,
      "': ",
      std::strerror(errno),
      " (is the folder writable?)");
  // The descriptor and the temporary file go on every way out but the
  // rename: a failed write, fsync or close, and whatever the writer throws.
  bool fd_open = true;
  auto discard = [&] {
    if (fd_open)
      ::close(fd);
    fd_open = false;
    ::unlink(tmp.c_str());
  };
  auto fail = [&](const std::string& what) {
    const std::string reason = std::strerror(errno);
    discard();
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
  } catch (...) {
    discard();  // a no-op after fail()'s own
    throw;
  }
  if (::fsync(fd) != 0)
    fail("fsync");
  fd_open = false;
  if (::close(fd) != 0)
    fail("close");
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

void make_parent_directories(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0)
    make_directories(path.substr(0, slash));
}

}  // namespace memtrain
