#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>

#include "agreed.h"
#include "commands.h"
#include "load_config.h"
#include "memtrain/dist/environment.h"
#include "memtrain/train/loop/trainer.h"
#include "memtrain/util/error.h"
#include "weights_run.h"

namespace memtrain::cli {

void add_eval(CLI::App& app, EvalArgs& args) {
  auto* cmd = app.add_subcommand(
      "eval",
      "Validate weights: builds the model of the config, loads --weights "
      "by name (strict: every tensor, of the model's shapes), runs the "
      "trainer's validation on data.val at any world size (mpirun -np N "
      "memtrain eval ...) and prints the validation figures: one line and "
      "one JSON object (type eval). Writes nothing.");
  cmd->add_option("--config", args.config, "YAML config file")
      ->check(CLI::ExistingFile);
  cmd->add_option(
         "--weights",
         args.weights,
         "a weights file (model.safetensors, best.safetensors, memtrain "
         "export's output, a state dict as safetensors or torch.save's "
         ".pt/.pth), loaded strictly")
      ->required();
  accept_overrides(cmd, args.overrides);
}

int run_eval(const EvalArgs& args, int* argc, char*** argv) {
  Environment env(argc, argv);
  if (!start_ranks(env))
    return kExitUsage;
  TrainConfig cfg;
  if (!agreed(env, "config", [&] {
        cfg = load_config(args.config, args.overrides);
      })) {
    return kExitUsage;
  }
  WeightsRun run;
  if (!start_weights_run(env, cfg, args.weights, &run))
    return kExitUsage;
  Trainer* trainer = run.trainer.get();
  if (!agreed(env, "eval", [&] {
        const std::string why_not = trainer->cannot_validate();
        MT_CHECK(why_not.empty(), "eval: ", why_not);
      })) {
    return kExitUsage;
  }
  std::string json, line;
  try {
    json = trainer->evaluate(&line);
  } catch (const std::exception& e) {
    std::fprintf(
        stderr,
        "memtrain: [rank %d, %s] error: %s\n",
        env.rank(),
        env.hostname().c_str(),
        e.what());
    std::fflush(stderr);
    env.abort(kExitFailure);
  }
  if (env.rank() == 0) {
    std::printf(
        "eval of %s on %s, %d rank(s): %s\n%s\n",
        args.weights.c_str(),
        cfg.data.val.c_str(),
        env.world_size(),
        line.c_str(),
        json.c_str());
  }
  return kExitOk;
}

}  // namespace memtrain::cli
