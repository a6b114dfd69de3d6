#include <CLI/CLI.hpp>

#include <cstdio>
#include <map>

#include "commands.h"
#include "memtrain/train/run_files/checkpoint.h"
#include "memtrain/util/error.h"
#include "memtrain/weights/safetensors.h"

namespace memtrain::cli {
namespace {
std::string checkpoint_file;
std::string out_file;
}  // namespace

void add_export(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "export",
      "Write a training checkpoint's model weights (parameters and buffers, "
      "named as in model.safetensors) to a safetensors file, atomically. "
      "The checkpoint's checksum is verified first. Exit status 2 for a "
      "missing, damaged or foreign checkpoint or an output that cannot be "
      "written.");
  cmd->add_option(
         "--checkpoint", checkpoint_file, "a checkpoint (ckpt-*.safetensors)")
      ->required();
  cmd->add_option("--out", out_file, "the weights file to write")->required();
}

int run_export() {
  MT_CHECK(
      out_file != checkpoint_file,
      "export: --out is the checkpoint itself ('",
      out_file,
      "'); name another file");
  const Checkpoint c = load_checkpoint(checkpoint_file);
  const std::map<std::string, std::string> meta = {
      {"format", "pt"},
      {"producer", "memtrain"},
      {"model", c.state.model},
      {"windows", std::to_string(c.state.step)},
      {"checkpoint", checkpoint_file}};
  try {
    save_safetensors(out_file, c.params, meta);
  } catch (const Error& e) {
    throw Error("export: --out '" + out_file + "': " + e.what());
  }
  std::printf(
      "exported %zu tensors of model %s (step %lld) from %s to %s\n",
      c.params.size(),
      c.state.model.c_str(),
      static_cast<long long>(c.state.step),
      checkpoint_file.c_str(),
      out_file.c_str());
  return kExitOk;
}

}  // namespace memtrain::cli
