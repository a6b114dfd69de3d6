#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "agreed.h"
#include "commands.h"
#include "memtrain/device/placement.h"
#include "memtrain/dist/cpu_threads.h"
#include "memtrain/dist/environment.h"
#include "memtrain/dist/make_communicator.h"
#include "memtrain/train/trainer.h"
#include "memtrain/util/error.h"

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
         "export's output, timm's state dict as safetensors)")
      ->required();
  accept_overrides(cmd, args.overrides);
}

int run_eval(const EvalArgs& args, int* argc, char*** argv) {
  Environment env(argc, argv);
  if (!agreed(
          env,
          "launch",
          [&] {
            check_launch_world(
                env.world_size(), [](const char* n) { return std::getenv(n); });
          }) ||
      !agreed(env, "threads", [&] { configure_cpu_threads(env); })) {
    return kExitUsage;
  }
  TrainConfig cfg;
  if (!agreed(env, "config", [&] {
        cfg = TrainConfig::load(args.config, args.overrides);
        MT_CHECK(
            !cfg.data.val.empty() || cfg.data.episodes.n_way > 0,
            "eval: data.val is empty: nothing to validate (set data.val)");
      })) {
    return kExitUsage;
  }
  env.set_collective_timeout(cfg.dist.timeout_s);
  std::unique_ptr<Placement> placement;
  std::unique_ptr<Communicator> comm;
  if (!agreed(
          env,
          "dist",
          [&] {
            placement = Placement::choose(
                cfg.dist.device, env.local_rank(), cfg.memory.allocator_conf);
          }) ||
      !agreed(env, "dist.backend", [&] {
        CommunicatorSpec spec;
        spec.backend = cfg.dist.backend;
        spec.cuda_device = placement->is_cuda();
        spec.device_index = placement->device().index();
        spec.timeout_s = cfg.dist.timeout_s;
        comm = make_communicator(MPI_COMM_WORLD, spec);
      })) {
    return kExitUsage;
  }
  Trainer::Options options;
  options.write_outputs = false;  // eval writes nothing
  options.placement = placement.get();
  std::unique_ptr<Trainer> trainer;
  if (!agreed(
          env,
          "start-up",
          [&] { trainer = std::make_unique<Trainer>(cfg, *comm, options); }) ||
      !agreed(env, "--weights", [&] { trainer->load_weights(args.weights); })) {
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
