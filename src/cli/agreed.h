#pragma once
// Private to src/cli/: what the sub-commands that start ranks share.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "memtrain/dist/environment.h"
#include "memtrain/util/error.h"

namespace memtrain::cli {

// Runs `step` on every rank; if it throws memtrain::Error on any rank, the
// lowest failing rank prints its message and every rank returns false.
// For checks that happen before ranks exchange data: nobody is left waiting.
template <typename F>
bool agreed(const Environment& env, const char* what, F&& step) {
  std::string error;
  bool peer = false;  // failed only because another rank did
  try {
    step();
  } catch (const PeerError&) {
    peer = true;
  } catch (const Error& e) {
    error = e.what();
  }
  int first = 0;
  if (env.all_ok(error.empty(), &first)) {
    MT_INTERNAL_ASSERT(!peer, "a peer failure without a failing rank");
    return true;
  }
  if (env.rank() == first) {
    std::fprintf(
        stderr,
        "memtrain: error: %s%s\n",
        error.c_str(),
        env.world_size() > 1
            ? (" [rank " + std::to_string(first) + ", " + what + "]").c_str()
            : "");
  }
  return false;
}

// Lets `cmd` take config overrides --section.key=value after its options,
// into `overrides` ("section.key=value"); anything else is an error.
inline void accept_overrides(
    CLI::App* cmd, std::vector<std::string>& overrides) {
  cmd->allow_extras();
  cmd->callback([cmd, &overrides] {
    for (const auto& extra : cmd->remaining()) {
      if (extra.rfind("--", 0) == 0 && extra.find('.') != std::string::npos &&
          extra.find('=') != std::string::npos) {
        overrides.push_back(extra.substr(2));
      } else {
        throw CLI::ExtrasError(
            "unexpected argument '" + extra +
                "': config overrides are written --section.key=value "
                "(e.g. --training.lr=0.1); see memtrain train --help",
            CLI::ExitCodes::ExtrasError);
      }
    }
  });
}

}  // namespace memtrain::cli
