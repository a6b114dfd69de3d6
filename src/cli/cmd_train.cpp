#include <torch/torch.h>
#include <torch/version.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>

#include "agreed.h"
#include "commands.h"
#include "load_config.h"
#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/device/placement.h"
#include "memtrain/dist/cpu_threads.h"
#include "memtrain/dist/environment.h"
#include "memtrain/dist/make_communicator.h"
#include "memtrain/infer/device_setup.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/train/loop/trainer.h"
#include "memtrain/train/run_files/output_dir.h"
#include "memtrain/train/state/stop_request.h"
#include "memtrain/util/atomic_file.h"
#include "memtrain/util/error.h"
#include "memtrain/util/file_digest.h"
#include "memtrain/util/rank_log.h"
#include "stage_data.h"

namespace memtrain::cli {

void add_train(CLI::App& app, TrainArgs& args) {
  auto* cmd = app.add_subcommand(
      "train",
      "Train. Start one rank per device: mpirun -np N memtrain train "
      "[--config FILE] [--section.key=value ...]. Without --config the "
      "built-in defaults are used (see --print-config).");
  cmd->add_option("--config", args.config, "YAML config file")
      ->check(CLI::ExistingFile);
  cmd->add_option(
      "--resume",
      args.resume,
      "continue from a checkpoint: a file, a folder (its newest valid one), "
      "or auto (output.dir's newest valid one, or the beginning if none)");
  cmd->add_flag(
      "--print-config",
      args.print_config,
      "print the resolved config as YAML and exit");
  cmd->add_flag(
      "--keys-markdown",
      args.keys_markdown,
      "print every config key as Markdown (docs/config.md) and exit");
  cmd->footer(
      "Config keys (YAML sections, or --section.key=value):\n" +
      TrainConfig::describe_keys());
  accept_overrides(cmd, args.overrides);
}

namespace {

// Collective: refuses when the ranks would read different data files
// (node-local copies that differ), naming each copy's ranks and hosts.
// A rank that cannot read a file says so in its entry; when none can, the
// data layer's own message comes later.
void check_same_data(const Environment& env, const DataConfig& data) {
  for (const auto& [key, path] :
       {std::pair<const char*, std::string>{"data.train", data.train},
        {"data.val", data.val}}) {
    if (path.empty())
      continue;
    std::string mine;
    try {
      mine = file_digest(path);
    } catch (const Error& e) {
      mine = std::string("nothing (") + e.what() + ")";
    }
    check_same_on_every_rank(
        env,
        mine,
        detail::concat(key, " '", path, "': the ranks read different files"),
        "read",
        "Put one copy in a folder every node sees, or copy the same file "
        "to every node (compare the copies with sha256sum), then start "
        "again");
  }
}

// The CUDA caching allocator's settings in force (memory.allocator_conf
// merged with PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF, the environment
// winning key by key), each key with where it came from; on a CPU device
// none are applied.
nlohmann::json allocator_conf_json() {
  const memory::AllocatorSettings in_force = memory::cuda_allocator_settings();
  nlohmann::json keys = nlohmann::json::array();
  for (const auto& e : in_force.entries)
    keys.push_back({{"key", e.key}, {"value", e.value}, {"from", e.from}});
  return {
      {"applied", memory::backend_name() == "cuda-caching"},
      {"in_force", in_force.text()},
      {"keys", keys}};
}

// environment.json (rank 0): where and with what this run ran.
void write_environment(
    const Environment& env,
    const TrainConfig& cfg,
    const Placement& place,
    const ThreadPlan& threads) {
  const BlasInfo blas = loaded_blas();
  nlohmann::json me = {
      {"rank", env.rank()},
      {"host", env.hostname()},
      {"pid", static_cast<int64_t>(::getpid())},
      {"local_rank", env.local_rank()},
      {"local_size", env.local_size()},
      {"node_index", env.node_index()},
      {"device", place.describe()},
      {"memory_backend", memory::backend_name()},
      {"threads", torch::get_num_threads()},
      {"threads_from", threads.reason},
      {"cpus", format_cpu_list(affinity_cpus())},
      {"blas", blas.library},
      {"blas_threads", blas.threads},
      {"allocator_conf", allocator_conf_json()},
      // training.cudnn_benchmark and model.channels_last as resolved here.
      {"cudnn_benchmark", place.is_cuda() && cudnn_benchmark_on(cfg.training)},
      {"channels_last", channels_last_on(cfg.model, place)}};
  const auto all = env.all_gather(me.dump());
  if (env.rank() != 0)
    return;
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(mpi, &len);
  std::string mpi_version(mpi, static_cast<size_t>(len));
  mpi_version = mpi_version.substr(0, mpi_version.find_first_of(",\n"));
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : all)
    ranks.push_back(nlohmann::json::parse(r));
  // The SLURM job this run is a step of (null outside SLURM): its id, the
  // step, how often it was requeued, where it runs.
  nlohmann::json slurm;
  for (const char* key :
       {"SLURM_JOB_ID",
        "SLURM_STEP_ID",
        "SLURM_RESTART_COUNT",
        "SLURM_JOB_NODELIST",
        "SLURM_JOB_PARTITION",
        "SLURM_CLUSTER_NAME"}) {
    if (const char* v = std::getenv(key)) {
      std::string name = std::string(key).substr(6);
      for (char& c : name)
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      slurm[name] = v;
    }
  }
  const nlohmann::json j = {
      {"memtrain", "0.1.0"},
      {"world_size", env.world_size()},
      {"nodes",
       {{"count", env.nodes().node_count()},
        {"ranks_per_node", env.nodes().ranks_per_node},
        {"layout", env.nodes().describe()}}},
      {"launcher", env.local_rank_source()},
      {"slurm", slurm},
      {"ranks", ranks},
      {"cuda_build", static_cast<bool>(MEMTRAIN_CUDA)},
      {"libraries",
       {{"libtorch", TORCH_VERSION},
        {"mpi", mpi_version},
        {"hdf5", hdf5_library_version()},
        {"compiler", __VERSION__}}}};
  write_file_atomically(cfg.output.dir + "/environment.json", j.dump(2) + "\n");
}

}  // namespace

int run_train(const TrainArgs& args, int* argc, char*** argv) {
  if (args.keys_markdown) {  // no ranks, no config file: the table only
    std::fputs(TrainConfig::describe_markdown().c_str(), stdout);
    return kExitOk;
  }
  install_stop_handlers();  // before MPI's, CUDA's and LibTorch's threads
  Environment env(argc, argv);
  // Before anything is written: N copies of a world of 1 (srun without
  // PMI, torchrun) would each train into the same output.dir.
  if (!agreed(env, "launch", [&] {
        check_launch_world(
            env.world_size(), [](const char* n) { return std::getenv(n); });
      })) {
    return kExitUsage;
  }
  // Every node runs the same memtrain (a stale copy on one node would
  // train with other code).
  if (!agreed(env, "build", [&] { check_same_build(env); }))
    return kExitUsage;
  ThreadPlan threads;
  if (!agreed(env, "threads", [&] { threads = configure_cpu_threads(env); }))
    return kExitUsage;

  TrainConfig cfg;
  if (!agreed(env, "config", [&] {
        cfg = load_config(args.config, args.overrides);
      })) {
    return kExitUsage;
  }
  env.set_collective_timeout(cfg.dist.timeout_s);
  if (args.print_config) {
    if (env.rank() == 0)
      std::fputs(cfg.to_yaml().c_str(), stdout);
    return kExitOk;
  }
  // data.stage_dir: each node's own copy, read from here on.
  std::vector<std::string> staged;
  if (!stage_data(env, &cfg.data, &staged))
    return kExitUsage;
  for (const auto& l : staged)
    std::printf("%s\n", l.c_str());
  // Every node reads the same data (node-local copies that differ would
  // train each node on other samples).
  if (!agreed(env, "data", [&] { check_same_data(env, cfg.data); }))
    return kExitUsage;
  // The device, once, before any tensor or data: it decides which memory
  // backend counts (the CPU accounting allocator or CUDA's caching
  // allocator, whose settings must precede its first allocation).
  std::unique_ptr<Placement> placement;
  if (!agreed(env, "dist.device", [&] {
        placement = Placement::choose(
            cfg.dist.device, env.local_rank(), cfg.memory.allocator_conf);
      })) {
    return kExitUsage;
  }

  // Every rank logs to output.dir/rank-N.log; a fresh run does not start
  // in another run's folder (Note [Output folders]).
  if (!agreed(env, "output.dir", [&] {
        check_output_dir(
            cfg.output.dir, !args.resume.empty(), cfg.output.overwrite);
        make_directories(cfg.output.dir);
        open_rank_log(
            cfg.output.dir + "/rank-" + std::to_string(env.rank()) + ".log");
      })) {
    return kExitUsage;
  }
  log_event(detail::concat(
      "start: rank ",
      env.rank(),
      "/",
      env.world_size(),
      " on ",
      env.hostname(),
      ", pid ",
      ::getpid(),
      ", local rank ",
      env.local_rank(),
      "/",
      env.local_size(),
      " (",
      env.local_rank_source(),
      "), device ",
      placement->describe(),
      " (memory: ",
      memory::backend_name(),
      "), ",
      torch::get_num_threads(),
      " threads (",
      threads.reason,
      "), config ",
      args.config.empty() ? "(built-in)" : args.config));
  // The communicator for the device (dist.backend), agreed on by every
  // rank before any backend starts.
  std::unique_ptr<Communicator> comm;
  if (!agreed(env, "dist.backend", [&] {
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
  options.placement = placement.get();
  options.progress = stdout;
  if (cfg.output.progress == ProgressDisplay::kAuto) {
    options.progress_is_tty = ::isatty(::fileno(stdout)) == 1 &&
                              env.local_rank_source() == "mpi-shared-memory" &&
                              env.world_size() == 1;
  } else {
    options.progress_is_tty = cfg.output.progress == ProgressDisplay::kTty;
  }
  std::unique_ptr<Trainer> trainer;
  if (!agreed(env, "start-up", [&] {
        trainer = std::make_unique<Trainer>(cfg, *comm, options);
      })) {
    return kExitUsage;
  }
  if (!agreed(env, "memory plan", [&] { trainer->prepare(); })) {
    return kExitUsage;
  }
  std::string resumed;
  if (!args.resume.empty() &&
      !agreed(env, "resume", [&] { resumed = trainer->resume(args.resume); })) {
    return kExitUsage;
  }

  // model.pretrained: after the resume decision (a resumed run keeps the
  // checkpoint's weights), before initial.safetensors.
  std::vector<std::string> pretrained;
  if (!agreed(env, "model.pretrained", [&] {
        pretrained = trainer->load_pretrained();
      })) {
    return kExitUsage;
  }

  log_event("plan: " + trainer->describe());
  if (!resumed.empty())
    log_event(resumed);
  write_environment(env, cfg, *placement, threads);
  // The launch banner, once: world, each rank's device, config, plan.
  std::ostringstream me;
  me << "rank " << env.rank() << ": host " << env.hostname() << " (node "
     << env.node_index() << "), local rank " << env.local_rank() << "/"
     << env.local_size() << ", device " << placement->describe() << ", "
     << torch::get_num_threads() << " threads";
  const auto ranks = env.all_gather(me.str());
  if (env.rank() == 0) {
    std::printf(
        "memtrain 0.1.0: %d rank(s) on %s, backend %s, local rank from "
        "%s\n",
        env.world_size(),
        env.nodes().describe().c_str(),
        to_string(comm->backend()),
        env.local_rank_source().c_str());
    for (const auto& r : ranks)
      std::printf("  %s\n", r.c_str());
    std::printf("config:\n");
    std::istringstream yaml(cfg.to_yaml());
    for (std::string l; std::getline(yaml, l);)
      std::printf("  %s\n", l.c_str());
    std::printf("%s\n", trainer->describe().c_str());
    if (!resumed.empty())
      std::printf("%s\n", resumed.c_str());
    for (const auto& l : pretrained)
      std::printf("%s\n", l.c_str());
    std::fflush(stdout);
  }

  TrainSummary summary;
  try {
    summary = trainer->run();
  } catch (const std::exception& e) {
    // Peers may be inside a collective: end the whole job now.
    log_event(std::string("error: ") + e.what());
    std::fprintf(
        stderr,
        "memtrain: [rank %d, %s] error: %s\n",
        env.rank(),
        env.hostname().c_str(),
        e.what());
    std::fflush(stderr);
    // A collective that failed on autograd's device thread (an overlapped
    // gradient bucket) ends the job here, on the MPI thread.
    if (const auto* f = dynamic_cast<const CollectiveFailure*>(&e))
      comm->end_job_after(*f);
    env.abort(kExitFailure);
  }
  if (summary.stopped) {
    if (env.rank() == 0) {
      std::printf(
          "stopped on a signal: checkpoint in %s/checkpoints; continue with "
          "--resume auto (exit status %d)\n",
          cfg.output.dir.c_str(),
          static_cast<int>(kExitStopped));
    }
    log_event("stopped on a stop request; checkpoint written");
    return kExitStopped;
  }
  if (env.rank() == 0) {
    std::printf(
        "done: %s/model.safetensors, %s/metrics.jsonl\n",
        cfg.output.dir.c_str(),
        cfg.output.dir.c_str());
  }
  log_event(detail::concat("done: ", summary.windows, " windows"));
  return kExitOk;
}

}  // namespace memtrain::cli
