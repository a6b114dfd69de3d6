#include "weights_run.h"

#include <cstdlib>

#include "agreed.h"
#include "memtrain/dist/cpu_threads.h"
#include "memtrain/dist/make_communicator.h"

namespace memtrain::cli {

bool start_ranks(Environment& env) {
  return agreed(
             env,
             "launch",
             [&] {
               check_launch_world(env.world_size(), [](const char* n) {
                 return std::getenv(n);
               });
             }) &&
         agreed(env, "threads", [&] { configure_cpu_threads(env); });
}

bool start_weights_run(
    Environment& env,
    const TrainConfig& cfg,
    const std::string& weights,
    WeightsRun* run) {
  env.set_collective_timeout(cfg.dist.timeout_s);
  if (!agreed(
          env,
          "dist",
          [&] {
            run->placement = Placement::choose(
                cfg.dist.device, env.local_rank(), cfg.memory.allocator_conf);
          }) ||
      !agreed(env, "dist.backend", [&] {
        CommunicatorSpec spec;
        spec.backend = cfg.dist.backend;
        spec.cuda_device = run->placement->is_cuda();
        spec.device_index = run->placement->device().index();
        spec.timeout_s = cfg.dist.timeout_s;
        run->comm = make_communicator(MPI_COMM_WORLD, spec);
      })) {
    return false;
  }
  Trainer::Options options;
  options.write_outputs = false;
  options.placement = run->placement.get();
  return agreed(
             env,
             "start-up",
             [&] {
               run->trainer =
                   std::make_unique<Trainer>(cfg, *run->comm, options);
             }) &&
         agreed(env, "--weights", [&] { run->trainer->load_weights(weights); });
}

}  // namespace memtrain::cli
