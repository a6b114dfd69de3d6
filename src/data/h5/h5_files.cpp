// HDF5 files as a whole: errors (HDF5's own reason and the OS's, taken
// from its error stack), write failures remembered by file, and creating,
// opening and finishing a file so that a failure is named and nothing is
// left open (Note [No HDF5 shutdown at exit]). Datasets and attributes are
// in h5_util.cpp; both are declared in h5_util.h.

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "data/h5/h5_util.h"
#include "memtrain/util/error.h"

namespace memtrain::h5 {

namespace {
// Said where HDF5 reported a failed write without any reason left to read
// (a message never ends in "': ").
constexpr const char* kNoReason =
    "HDF5 reported the failure without a reason (its error stack was empty)";

// The descriptions on HDF5's current error stack, outermost (the API call)
// first.
std::vector<std::string> error_descs() {
  std::vector<std::string> descs;
  H5Ewalk2(
      H5E_DEFAULT,
      H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* err, void* data) -> herr_t {
        static_cast<std::vector<std::string>*>(data)->push_back(
            err->desc ? err->desc : "");
        return 0;
      },
      &descs);
  return descs;
}

// HDF5's file drivers record a failed system call as "... errno = 28,
// error message = 'No space left on device', ...": the OS's reason.
std::string system_reason_in(const std::vector<std::string>& descs) {
  static const std::string key = "error message = '";
  for (auto it = descs.rbegin(); it != descs.rend(); ++it) {
    const size_t at = it->find(key);
    if (at == std::string::npos)
      continue;
    const size_t start = at + key.size();
    const size_t end = it->find('\'', start);
    if (end != std::string::npos && end > start)
      return it->substr(start, end - start);
  }
  return "";
}
}  // namespace

std::string last_error() {
  const std::vector<std::string> descs = error_descs();
  if (descs.empty())
    return "";
  // A failed system call says it all ("No space left on device"): the
  // messages above it are HDF5's layers passing it on.
  const std::string os = system_reason_in(descs);
  if (!os.empty())
    return os;
  std::string msg = descs.front();
  if (descs.size() > 1 && !descs.back().empty() &&
      descs.back() != descs.front()) {
    // The innermost message says why ("truncated file: eof = 18886,
    // stored_eof = 43832"); the ones between repeat the outermost.
    msg += ": " + descs.back();
  }
  return msg;
}

std::string system_reason() {
  return system_reason_in(error_descs());
}

namespace {
// Write failures HDF5 reported on this thread, by file ("" where HDF5 named
// none): the first reason for each.
// A failure HDF5 names no file for (no system call failed: a filter, a
// bad argument) counts against the files created before it, not after:
// each failure and each created file have a number in one sequence.
struct Failure {
  uint64_t seq = 0;
  std::string reason;
};
thread_local std::map<std::string, Failure> failed_writes;
thread_local std::map<std::string, uint64_t> created_at;
thread_local uint64_t sequence = 0;

// filename = '...' of a driver's failed system call.
std::string file_in(const std::vector<std::string>& descs) {
  static const std::string key = "filename = '";
  for (const std::string& d : descs) {
    const size_t at = d.find(key);
    if (at == std::string::npos)
      continue;
    const size_t start = at + key.size();
    const size_t end = d.find('\'', start);
    if (end != std::string::npos)
      return d.substr(start, end - start);
  }
  return "";
}

// HDF5 calls this in place of printing, for every failed API call.
herr_t remember_write_failure(hid_t estack, void*) {
  struct Walk {
    std::vector<std::string> descs;
    bool write = false;
  } walk;
  H5Ewalk2(
      estack,
      H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* err, void* data) -> herr_t {
        auto* w = static_cast<Walk*>(data);
        w->descs.push_back(err->desc ? err->desc : "");
        if (err->min_num == H5E_WRITEERROR || err->min_num == H5E_CANTFLUSH)
          w->write = true;
        return 0;
      },
      &walk);
  if (!walk.write)
    return 0;
  std::string reason = system_reason_in(walk.descs);
  if (reason.empty() && !walk.descs.empty())
    reason = walk.descs.back();
  const std::string file = file_in(walk.descs);
  if (file.empty())
    failed_writes[""] = {++sequence, reason};  // the latest: see write_failure
  else
    failed_writes.emplace(file, Failure{++sequence, reason});
  return 0;
}

std::string folder_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Free bytes for an unprivileged writer on the file system of `path`'s
// folder; false if unknown.
bool free_bytes(const std::string& path, uint64_t* out) {
  struct statvfs st {};
  if (::statvfs(folder_of(path).c_str(), &st) != 0)
    return false;
  *out = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  return true;
}
}  // namespace

// Note [No HDF5 shutdown at exit]: HDF5 1.10 keeps the id of a file whose
// H5Fclose failed (its last flush hit a full disk) over a file object it
// has already half taken apart; its own shutdown, installed with atexit(),
// then closes that file again and dies with SIGSEGV in H5F__close_cb
// after memtrain printed its error. memtrain closes every file it writes
// itself, checking the result (finish_file), and a file it only reads
// needs no close at exit, so the shutdown is never installed. It must be
// said before any other HDF5 call: here, at static initialization.
const bool kNoShutdownAtExit = [] {
  H5dont_atexit();
  return true;
}();

void silence_errors() {
  (void)kNoShutdownAtExit;
  // Thread-safe HDF5 keeps an error stack, and its printing, per thread.
  thread_local bool done = false;
  if (!done)
    H5Eset_auto2(H5E_DEFAULT, remember_write_failure, nullptr);
  done = true;
}

herr_t close_file_and_objects(hid_t id) {
  herr_t rc = 0;
  const ssize_t n = H5Fget_obj_count(
      id,
      H5F_OBJ_DATASET | H5F_OBJ_GROUP | H5F_OBJ_DATATYPE | H5F_OBJ_ATTR |
          H5F_OBJ_LOCAL);
  if (n > 0) {
    std::vector<hid_t> ids(static_cast<size_t>(n));
    const ssize_t got = H5Fget_obj_ids(
        id,
        H5F_OBJ_DATASET | H5F_OBJ_GROUP | H5F_OBJ_DATATYPE | H5F_OBJ_ATTR |
            H5F_OBJ_LOCAL,
        ids.size(),
        ids.data());
    for (ssize_t i = 0; i < got; ++i) {
      // The id goes away even when the close fails (HDF5 1.10: a dataset
      // whose chunks cannot be written is still closed).
      const herr_t r =
          H5Iget_type(ids[i]) == H5I_ATTR ? H5Aclose(ids[i]) : H5Oclose(ids[i]);
      if (r < 0)
        rc = r;
    }
  }
  const herr_t r = H5Fclose(id);
  return r < 0 ? r : rc;
}

std::string open_failure(
    const std::string& path, hid_t fapl, bool suggest_verify) {
  silence_errors();
  if (H5Fis_hdf5(path.c_str()) <= 0)
    return "not an HDF5 file (memtrain reads the HDF5 layout of "
           "docs/data-format.md; `memtrain inspect FILE` checks a file)";
  const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
  if (id >= 0) {
    close_file_and_objects(id);
    return "";
  }
  const std::string why = "cannot open: " + last_error();
  if (!suggest_verify)
    return why;
  return why +
         " (damaged or truncated? check it with `memtrain inspect "
         "--verify " +
         path + "`)";
}

Handle open_file(
    const std::string& path, const std::string& where, hid_t fapl) {
  silence_errors();
  if (H5Fis_hdf5(path.c_str()) > 0) {
    Handle f = file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl));
    if (f.valid())
      return f;
  }
  throw Error(where + ": " + open_failure(path, fapl));
}

Handle create_file(const std::string& path, const std::string& command) {
  silence_errors();
  failed_writes.erase(path);
  created_at[path] = ++sequence;
  Handle f =
      file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  if (!f.valid()) {
    const std::string os = system_reason();
    throw Error(
        command + ": cannot create '" + path + "': " +
        (os.empty() ? last_error() + " (does the folder exist and is it "
                                     "writable?)"
                    : os));
  }
  return f;
}

std::string write_failure(const std::string& path) {
  auto it = failed_writes.find(path);
  if (it != failed_writes.end())
    return it->second.reason;
  it = failed_writes.find("");
  const auto made = created_at.find(path);
  if (it == failed_writes.end() || made == created_at.end() ||
      it->second.seq < made->second)
    return "";
  return it->second.reason;
}

std::string write_reason(hid_t obj) {
  const std::string why = last_error();
  if (why.empty()) {
    // A call since the failure cleared the stack: what HDF5 reported for
    // the file when it failed (remember_write_failure), never nothing.
    const std::string path = file_name(obj);
    const std::string earlier = write_failure(path);
    return earlier.empty() ? kNoReason : earlier + free_space_note(path);
  }
  if (system_reason().empty())
    return why;
  return why + free_space_note(file_name(obj));
}

std::string free_space_note(const std::string& path) {
  uint64_t free = 0;
  if (!free_bytes(path, &free))
    return "";
  return " (" + std::to_string(free) + " bytes free on its file system)";
}

void finish_file(Handle* f, const std::string& command) {
  if (!f->valid())
    return;
  const std::string path = file_name(f->get());
  const hid_t id = f->release();
  std::string why;
  const herr_t rc = close_file_and_objects(id);
  if (rc < 0)
    why = last_error();
  const std::string earlier = write_failure(path);
  failed_writes.erase(path);
  created_at.erase(path);
  if (rc >= 0 && earlier.empty())
    return;
  // The first failure is the cause; the close's repeats it.
  const std::string reason = !earlier.empty() ? earlier
                             : !why.empty()   ? why
                                              : kNoReason;
  throw Error(
      command + ": cannot write '" + path + "': " + reason +
      free_space_note(path));
}

}  // namespace memtrain::h5
