#pragma once
// Errors. memtrain separates what a user did wrong (a config key, a file, a
// flag: `memtrain::Error`, raised with MT_CHECK) from a broken invariant
// inside memtrain (`memtrain::InternalError`, raised with
// MT_INTERNAL_ASSERT). Library code never calls exit(): `main` catches, prints
// the message once and ends every rank with a non-zero status.

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace memtrain {

// Process exit statuses, documented in docs/commands.md ("Exit statuses").
enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,  // runtime failure (a peer died, I/O failed, a bug)
  kExitUsage = 2,    // bad config, bad flag, bad input file
  kExitStopped = 3,  // stopped by a signal after writing a checkpoint:
                     // requeue and continue with --resume auto
};

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Thrown on the ranks that did fine when a collective check found that
// another rank failed: that rank reports why (see cli/cmd_train.cpp agreed()).
class PeerError : public Error {
 public:
  explicit PeerError(const std::string& what) : Error(what) {}
};

class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what) : std::logic_error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
}  // namespace detail

// Throws memtrain::Error "[rank R, HOST] CALL failed at FILE:LINE: MESSAGE":
// the one message format of the check macros that wrap MPI, NCCL and CUDA
// calls (MT_MPI_CHECK, MT_NCCL_CHECK, MT_CUDA_CHECK), with the library's
// own text in MESSAGE.
[[noreturn]] void throw_library_error(
    int rank,
    const char* call,
    const char* file,
    int line,
    const std::string& message);

// "1.5 MiB", "512 B": for messages and logs.
std::string format_bytes(double bytes);

// `s` without its leading and trailing spaces and tabs.
std::string trim(const std::string& s);

// `s` split at its commas, each item trimmed; "a,,b" has an empty item and
// a trailing comma an empty last one ("" has none).
std::vector<std::string> split_list(const std::string& s);

}  // namespace memtrain

#define MT_CHECK(cond, ...)                                             \
  do {                                                                  \
    if (!(cond)) {                                                      \
      throw ::memtrain::Error(::memtrain::detail::concat(__VA_ARGS__)); \
    }                                                                   \
  } while (0)

#define MT_INTERNAL_ASSERT(cond, ...)                             \
  do {                                                            \
    if (!(cond)) {                                                \
      throw ::memtrain::InternalError(::memtrain::detail::concat( \
          "internal error at ",                                   \
          __FILE__,                                               \
          ":",                                                    \
          __LINE__,                                               \
          ": " #cond " ",                                         \
          ##__VA_ARGS__));                                        \
    }                                                             \
  } while (0)
