#include "memtrain/train/run_files/output_dir.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "memtrain/util/error.h"

namespace memtrain {

// Note [Output folders]
// A second run into the same output.dir used to truncate the first run's
// metrics.jsonl, overwrite its weights and prune its later checkpoints. Now
// a run that does not resume (`--resume` absent) checks the folder before
// anything is written (cmd_train, on every rank, before the rank logs are
// opened): if it holds a checkpoint, a non-empty metrics.jsonl or weights,
// the run stops and names the ways out — continue that run (--resume auto),
// replace it (--output.overwrite=true: its files are deleted when the run
// starts, after planning, by rank 0) or choose another folder. A resumed
// run continues the folder's run by definition.

namespace {

bool is_file(const std::string& path, bool non_empty) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         (!non_empty || st.st_size > 0);
}

// Names in `dir` that start with `prefix` and end with `suffix`.
std::vector<std::string> names_in(
    const std::string& dir,
    const std::string& prefix,
    const std::string& suffix) {
  std::vector<std::string> out;
  DIR* h = ::opendir(dir.c_str());
  if (!h)
    return out;
  while (dirent* e = ::readdir(h)) {
    const std::string n = e->d_name;
    if (n.size() >= prefix.size() + suffix.size() &&
        n.compare(0, prefix.size(), prefix) == 0 &&
        n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
      out.push_back(n);
  }
  ::closedir(h);
  return out;
}

}  // namespace

std::vector<std::string> previous_run_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& n : names_in(dir + "/checkpoints", "ckpt-", ".safetensors"))
    out.push_back("checkpoints/" + n);
  if (is_file(dir + "/metrics.jsonl", /*non_empty=*/true))
    out.push_back("metrics.jsonl");
  for (const char* n : {"model.safetensors", "best.safetensors"}) {
    if (is_file(dir + "/" + n, false))
      out.push_back(n);
  }
  return out;
}

void check_output_dir(const std::string& dir, bool resuming, bool overwrite) {
  if (resuming || overwrite)
    return;
  const std::vector<std::string> used = previous_run_files(dir);
  if (used.empty())
    return;
  std::string list;
  for (size_t i = 0; i < used.size() && i < 4; ++i)
    list += (i ? ", " : "") + used[i];
  if (used.size() > 4)
    list += ", ... (" + std::to_string(used.size()) + " files)";
  throw Error(
      "output.dir '" + dir + "' holds another run (" + list +
      "); a fresh run would overwrite its metrics and weights and prune its "
      "checkpoints. Continue that run with --resume auto, replace it with "
      "--output.overwrite=true, or choose another --output.dir");
}

std::vector<std::string> clear_previous_run(const std::string& dir) {
  std::vector<std::string> gone;
  auto remove = [&](const std::string& rel) {
    if (::unlink((dir + "/" + rel).c_str()) == 0)
      gone.push_back(rel);
  };
  for (const auto& n : names_in(dir + "/checkpoints", "ckpt-", ".safetensors"))
    remove("checkpoints/" + n);
  for (const auto& n : names_in(dir + "/tb", "events.out.tfevents", ""))
    remove("tb/" + n);
  for (const auto& epoch : names_in(dir + "/val", "epoch-", "")) {
    for (const auto& n : names_in(dir + "/val/" + epoch, "case-", ".png"))
      remove("val/" + epoch + "/" + n);
    remove("val/" + epoch + "/summary.json");
    ::rmdir((dir + "/val/" + epoch).c_str());
  }
  for (const char* n :
       {"metrics.jsonl",
        "metrics.csv",
        "model.safetensors",
        "best.safetensors",
        "initial.safetensors",
        "memory_plan.json",
        "episodes.json",
        "progress.png"})
    remove(n);
  return gone;
}

}  // namespace memtrain
