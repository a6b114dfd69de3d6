#include "stage_data.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "agreed.h"
#include "memtrain/util/atomic_file.h"
#include "memtrain/util/error.h"
#include "memtrain/util/fnv.h"
#include "memtrain/util/temp_path.h"

namespace memtrain::cli {
namespace {

constexpr const char* kFix =
    "Give data.stage_dir a folder every node can write (a local disk, "
    "$TMPDIR), or leave it empty to read the data where they are";

// One data file to stage: its key, source and the copy's path.
struct Staged {
  const char* key = nullptr;    // "data.train"
  std::string* path = nullptr;  // the config's entry, replaced at the end
  std::string source;           // as configured
  long long size = 0;           // bytes
  std::string copy;             // STAGE/NAME.KEY.h5
  bool present =
      false;  // a whole copy is there already (the node leader's view)
  std::string partial;  // copy + ".tmp." + the node leader's PID
};

std::string errno_text() {
  return std::strerror(errno);
}

// The copy's name: NAME.KEY.h5 from the source's real path, size and
// modification time (another file, or this one changed, is another copy).
std::string copy_name(const std::string& source, const struct stat& st) {
  char real[PATH_MAX];
  const std::string where =
      ::realpath(source.c_str(), real) != nullptr ? real : source;
  uint64_t h = fnv1a(kFnvOffset, where.data(), where.size());
  const long long size = st.st_size;
  const long long sec = st.st_mtim.tv_sec;
  const long long nsec = st.st_mtim.tv_nsec;
  h = fnv1a(h, &size, sizeof size);
  h = fnv1a(h, &sec, sizeof sec);
  h = fnv1a(h, &nsec, sizeof nsec);
  std::string name = where.substr(where.find_last_of('/') + 1);
  const size_t dot = name.rfind('.');
  if (dot != std::string::npos && dot > 0)
    name = name.substr(0, dot);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return detail::concat(name, ".", hex, ".h5");
}

// The nearest folder of `dir` that exists ("/scratch/a/b" -> "/scratch"
// when a/b are still to be made).
std::string nearest_existing(std::string dir) {
  struct stat st;
  while (::stat(dir.c_str(), &st) != 0) {
    const size_t slash = dir.find_last_of('/');
    if (slash == std::string::npos)
      return ".";
    dir = slash == 0 ? "/" : dir.substr(0, slash);
  }
  return dir;
}

// The node leader's check: the folder (or the one it would be made in) is
// a folder, takes a file, and has room for `needed` bytes. Leaves nothing.
void check_stage_dir(
    const std::string& dir, const std::string& host, long long needed) {
  const std::string base = nearest_existing(dir);
  const std::string where =
      base == dir
          ? "'" + dir + "'"
          : detail::concat("'", base, "' (where '", dir, "' would be made)");
  struct stat st;
  MT_CHECK(
      ::stat(base.c_str(), &st) == 0 && S_ISDIR(st.st_mode),
      "data.stage_dir '",
      dir,
      "' on ",
      host,
      ": '",
      base,
      "' is not a folder. ",
      kFix);
  std::string probe = base + "/.memtrain-stage-probe-XXXXXX";
  const int fd = ::mkstemp(probe.data());
  MT_CHECK(
      fd >= 0,
      "data.stage_dir '",
      dir,
      "' cannot be written on ",
      host,
      ": no file can be made in ",
      where,
      ": ",
      errno_text(),
      ". ",
      kFix);
  ::close(fd);
  ::unlink(probe.c_str());
  struct statvfs fs;
  MT_CHECK(
      ::statvfs(base.c_str(), &fs) == 0,
      "data.stage_dir '",
      dir,
      "' on ",
      host,
      ": cannot read the free space of ",
      where,
      ": ",
      errno_text());
  const double free_bytes =
      static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize);
  MT_CHECK(
      free_bytes >= static_cast<double>(needed),
      "data.stage_dir '",
      dir,
      "' on ",
      host,
      " has ",
      format_bytes(free_bytes),
      " free; the copies of the data need ",
      format_bytes(static_cast<double>(needed)),
      ". Free space there, give another folder, or leave data.stage_dir "
      "empty to read the data where they are");
}

// Copies bytes [from, to) of `source` into the same range of `partial`
// (made and sized by the node's leader), then syncs them.
void copy_stripe(
    const std::string& source,
    const std::string& partial,
    long long from,
    long long to,
    const std::string& host) {
  const int in = ::open(source.c_str(), O_RDONLY | O_CLOEXEC);
  MT_CHECK(in >= 0, "cannot open '", source, "': ", errno_text());
  const int out = ::open(partial.c_str(), O_WRONLY | O_CLOEXEC);
  if (out < 0) {
    const std::string why = errno_text();
    ::close(in);
    throw Error(detail::concat(
        "data.stage_dir on ", host, ": cannot open '", partial, "': ", why));
  }
  std::vector<char> buf(4 << 20);
  std::string error;
  for (long long at = from; at < to && error.empty();) {
    const size_t want = static_cast<size_t>(
        std::min<long long>(to - at, static_cast<long long>(buf.size())));
    const ssize_t got = ::pread(in, buf.data(), want, at);
    if (got <= 0) {
      error = detail::concat(
          "cannot read '",
          source,
          "' at byte ",
          at,
          ": ",
          got == 0 ? "the file ends early (changed while copied?)"
                   : errno_text());
      break;
    }
    for (ssize_t done = 0; done < got;) {
      const ssize_t put = ::pwrite(
          out, buf.data() + done, static_cast<size_t>(got - done), at + done);
      if (put < 0) {
        error = detail::concat(
            "data.stage_dir on ",
            host,
            ": cannot write '",
            partial,
            "': ",
            errno_text(),
            ". ",
            kFix);
        break;
      }
      done += put;
    }
    at += got;
  }
  if (error.empty() && ::fsync(out) != 0)
    error = detail::concat(
        "data.stage_dir on ",
        host,
        ": cannot sync '",
        partial,
        "': ",
        errno_text());
  ::close(in);
  ::close(out);
  MT_CHECK(error.empty(), error);
}

}  // namespace

bool stage_data(
    const Environment& env, DataConfig* data, std::vector<std::string>* said) {
  if (data->stage_dir.empty())
    return true;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string dir = data->stage_dir;
  const std::string& host = env.hostname();
  // This node's ranks, lowest first: the first is its leader; each copies
  // the stripe of its position.
  std::vector<int> mine;
  const auto& nodes = env.nodes();
  for (int r = 0; r < env.world_size(); ++r)
    if (nodes.node_of_rank[static_cast<size_t>(r)] == env.node_index())
      mine.push_back(r);
  const bool leader = mine.front() == env.rank();
  size_t position = 0;
  while (mine[position] != env.rank())
    ++position;

  std::vector<Staged> files;
  for (auto [key, path] :
       {std::pair<const char*, std::string*>{"data.train", &data->train},
        {"data.val", &data->val}}) {
    if (path->empty())
      continue;
    Staged f;
    f.key = key;
    f.path = path;
    f.source = *path;
    files.push_back(f);
  }
  // 1. The sources and the copies' names; on every node, its leader checks
  //    the folder before any node copies (a node that cannot: nothing
  //    copied anywhere).
  long long needed = 0;
  if (!agreed(env, "data.stage_dir", [&] {
        for (auto& f : files) {
          struct stat st;
          const bool found = ::stat(f.source.c_str(), &st) == 0;
          const std::string why = found ? "not a regular file" : errno_text();
          MT_CHECK(
              found && S_ISREG(st.st_mode),
              f.key,
              " '",
              f.source,
              "': ",
              why,
              " on ",
              host,
              " (data.stage_dir copies it from there)");
          f.size = st.st_size;
          f.copy = dir + "/" + copy_name(f.source, st);
          struct stat have;
          f.present = ::stat(f.copy.c_str(), &have) == 0 &&
                      S_ISREG(have.st_mode) && have.st_size == st.st_size;
          if (!f.present)
            needed += f.size;
        }
        if (leader)
          check_stage_dir(dir, host, needed);
      })) {
    return false;
  }
  // 2. Every rank of a node takes its leader's view: which copies are
  //    there ('1' a file), and its PID, the partial files' suffix. The
  //    leader makes the folder and each missing copy's partial file at its
  //    full size.
  std::string view;
  for (const auto& f : files)
    view += f.present ? '1' : '0';
  const auto views = env.all_gather(view + " " + std::to_string(::getpid()));
  const std::string& lead = views[static_cast<size_t>(mine.front())];
  // Nodes that copy file i, counted at each node's leader (its lowest rank).
  std::vector<int> copied_on(files.size(), 0);
  std::vector<bool> counted(static_cast<size_t>(nodes.node_count()), false);
  for (int r = 0; r < env.world_size(); ++r) {
    const auto node =
        static_cast<size_t>(nodes.node_of_rank[static_cast<size_t>(r)]);
    for (size_t i = 0; !counted[node] && i < files.size(); ++i)
      copied_on[i] += views[static_cast<size_t>(r)][i] == '0' ? 1 : 0;
    counted[node] = true;
  }
  for (size_t i = 0; i < files.size(); ++i) {
    files[i].present = lead[i] == '1';
    files[i].partial = files[i].copy + ".tmp." + lead.substr(files.size() + 1);
  }
  if (!agreed(env, "data.stage_dir", [&] {
        if (!leader)
          return;
        make_directories(dir);
        for (const auto& f : files) {
          if (f.present)
            continue;
          remove_stale_temp_files(f.copy);  // a leg killed while copying
          const int fd = ::open(
              f.partial.c_str(),
              O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
              0644);
          MT_CHECK(
              fd >= 0,
              "data.stage_dir '",
              dir,
              "' on ",
              host,
              ": cannot make '",
              f.partial,
              "': ",
              errno_text(),
              ". ",
              kFix);
          const bool sized = ::ftruncate(fd, f.size) == 0;
          const std::string why = errno_text();
          ::close(fd);
          MT_CHECK(
              sized,
              "data.stage_dir '",
              dir,
              "' on ",
              host,
              ": cannot size '",
              f.partial,
              "' to ",
              f.size,
              " bytes: ",
              why,
              ". ",
              kFix);
        }
      })) {
    return false;
  }
  // 3. Every rank copies its stripe of each missing file.
  if (!agreed(env, "data.stage_dir", [&] {
        for (const auto& f : files) {
          if (f.present)
            continue;
          const long long n = static_cast<long long>(mine.size());
          const long long p = static_cast<long long>(position);
          copy_stripe(
              f.source, f.partial, f.size * p / n, f.size * (p + 1) / n, host);
        }
      })) {
    for (const auto& f : files)
      if (leader && !f.present)
        ::unlink(f.partial.c_str());
    return false;
  }
  // 4. The leader publishes the whole copies.
  if (!agreed(env, "data.stage_dir", [&] {
        if (!leader)
          return;
        for (const auto& f : files) {
          if (f.present)
            continue;
          MT_CHECK(
              std::rename(f.partial.c_str(), f.copy.c_str()) == 0,
              "data.stage_dir on ",
              host,
              ": cannot rename '",
              f.partial,
              "' to '",
              f.copy,
              "': ",
              errno_text());
        }
        const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd >= 0) {
          ::fsync(fd);
          ::close(fd);
        }
      })) {
    return false;
  }
  char seconds[32];
  std::snprintf(
      seconds,
      sizeof(seconds),
      "%.2f",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count());
  for (size_t i = 0; i < files.size(); ++i) {
    const Staged& f = files[i];
    const int n = nodes.node_count();
    if (env.rank() == 0 && copied_on[i] == 0) {
      said->push_back(detail::concat(
          "data.stage_dir: ",
          f.key,
          " '",
          f.source,
          "' found as '",
          f.copy,
          "' on every node (",
          n,
          "; ",
          format_bytes(static_cast<double>(f.size)),
          ")"));
    } else if (env.rank() == 0) {
      said->push_back(detail::concat(
          "data.stage_dir: ",
          f.key,
          " '",
          f.source,
          "' copied to '",
          f.copy,
          "' on ",
          copied_on[i],
          " of ",
          n,
          " node(s) (",
          format_bytes(static_cast<double>(f.size)),
          ", ",
          seconds,
          " s)"));
    }
    *f.path = f.copy;
  }
  return true;
}

}  // namespace memtrain::cli
