// bench_overlap: the communication a window exposes, with and without
// overlapping the boundary all-reduce with the last micro-step's backward
// (Note [Overlapping the boundary all-reduce]). Run it under mpirun with 2
// or more ranks: the same training, same data, same model, once with
// dist.overlap=false and once with true; prints per-window means of
// t_compute_s (micro-steps), t_comm_exposed_s (waiting for the all-reduce
// after backward ended) and window_s, and writes CSV.
//
//   mpirun -np 2 bench_overlap [--hidden 1024] [--depth 2] [--micro 16]
//       [--steps 2] [-w 1] [-n 5] [--bucket-mib 25] [--csv FILE]
//       [--device cpu|cuda] [--backend auto|mpi|nccl]
//   --device cuda (a CUDA build): GPU <local rank>; NCCL by default (one GPU
//   per rank), --backend mpi for ranks sharing one GPU
//   --hidden/--depth  the residual MLP (gradient 8 x hidden^2 x depth floats)
//   -w  warm-up windows (not timed)   -n  timed windows
//
// Before timing, both runs' final parameters are compared (they must agree
// to float rounding: the same sums, reduced in other pieces of time).

#include <mpi.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "memtrain/data/synthetic/synthetic.h"
#include "memtrain/device/placement.h"
#include "memtrain/dist/cpu_threads.h"
#include "memtrain/dist/environment.h"
#include "memtrain/dist/make_communicator.h"
#include "memtrain/dist/mpi_communicator.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/train/loop/trainer.h"
#include "memtrain/util/error.h"

using namespace memtrain;

namespace {

struct Figures {
  double compute_s = 0, exposed_s = 0, window_s = 0, early = 0;
  int64_t buckets = 0;
  int64_t grad_bytes = 0;
  NamedTensors params;
};

Figures run(
    const TrainConfig& base,
    bool overlap,
    int64_t warmup,
    const Placement& place) {
  TrainConfig c = base;
  c.dist.overlap = overlap;
  CommunicatorSpec spec;
  spec.backend = c.dist.backend;
  spec.cuda_device = place.is_cuda();
  spec.device_index = place.device().index();
  auto comm = make_communicator(MPI_COMM_WORLD, spec);
  Trainer::Options opts;
  opts.write_outputs = false;
  opts.placement = &place;
  Trainer t(c, *comm, opts);
  const TrainSummary s = t.run();
  Figures f;
  int64_t n = 0;
  for (size_t i = static_cast<size_t>(warmup); i < s.window_results.size();
       ++i) {
    const WindowResult& w = s.window_results[i];
    f.compute_s += w.compute_s;
    f.exposed_s += w.comm_exposed_s;
    f.window_s += w.seconds;
    f.early += static_cast<double>(w.buckets_early);
    f.grad_bytes = w.allreduce_bytes;
    f.buckets = w.allreduce_calls;
    ++n;
  }
  f.compute_s /= n;
  f.exposed_s /= n;
  f.window_s /= n;
  f.early /= n;
  for (auto& [name, p] : t.named_parameters())
    f.params.emplace_back(name, p.clone());
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  CLI::App app("bench_overlap");
  int64_t hidden = 1024, depth = 2, micro = 16, steps = 2, warmup = 1,
          windows = 5;
  double bucket_mib = 25.0;
  std::string csv, device = "cpu", backend = "auto";
  app.add_option("--device", device)->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--backend", backend)
      ->check(CLI::IsMember({"auto", "mpi", "nccl"}));
  app.add_option("--hidden", hidden);
  app.add_option("--depth", depth);
  app.add_option("--micro", micro);
  app.add_option("--steps", steps);
  app.add_option("-w", warmup);
  app.add_option("-n", windows);
  app.add_option("--bucket-mib", bucket_mib);
  app.add_option("--csv", csv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    MPI_Finalize();
    return rc;
  }
  Environment env(nullptr, nullptr);  // MPI is initialised: not owned
  configure_cpu_threads(env);  // as the trainer (Note [Threads per rank])
  // Before any tensor: the device decides which memory backend counts.
  const auto place = Placement::choose(
      choice_of<DeviceChoice>(device),
      env.local_rank(),
      TrainConfig().memory.allocator_conf);
  const int64_t features = 64;
  const std::string dir =
      (std::filesystem::temp_directory_path() / "bench_overlap").string();
  if (rank == 0) {
    std::filesystem::create_directories(dir);
    SyntheticSpec spec;
    spec.samples = world * micro * steps * (warmup + windows);
    spec.features = features;
    spec.classes = 4;
    make_synthetic(spec, dir + "/train.h5");
  }
  MPI_Barrier(MPI_COMM_WORLD);

  TrainConfig c;
  c.data.train = dir + "/train.h5";
  c.data.val = "";
  c.data.batch_size = micro;
  c.data.prefetch = 0;
  c.model.hidden = hidden;
  c.model.depth = depth;
  c.training.gradient_accumulation_steps = steps;
  c.training.epochs = 1;
  c.training.max_windows = warmup + windows;
  c.training.lr = 0.01;
  c.dist.bucket_mib = bucket_mib;
  c.dist.check_replicas = CheckReplicas::kOff;
  c.dist.device = choice_of<DeviceChoice>(device);
  c.dist.backend = choice_of<BackendChoice>(backend);
  c.output.dir = dir + "/out";

  const Figures off = run(c, false, warmup, *place);
  const Figures on = run(c, true, warmup, *place);
  double diff = 0;
  for (size_t i = 0; i < off.params.size(); ++i) {
    diff = std::max(
        diff,
        (off.params[i].second - on.params[i].second)
            .abs()
            .max()
            .item<double>());
  }
  if (rank == 0) {
    std::printf(
        "# bench_overlap: %d rank(s), device %s, %s, LibTorch %s; MLP "
        "hidden %lld depth %lld: gradient %.1f MiB in %lld bucket(s) of <= "
        "%.3g MiB; %lld micro-steps of %lld; %lld timed window(s) after "
        "%lld warm-up\n",
        world,
        place->describe().c_str(),
        backend.c_str(),
        TORCH_VERSION,
        static_cast<long long>(hidden),
        static_cast<long long>(depth),
        off.grad_bytes / 1048576.0,
        static_cast<long long>(off.buckets),
        bucket_mib,
        static_cast<long long>(steps),
        static_cast<long long>(micro),
        static_cast<long long>(windows),
        static_cast<long long>(warmup));
    std::printf("# check: max |params(off) - params(on)| = %.3g\n", diff);
    std::printf(
        "%-8s %12s %16s %10s %14s\n",
        "overlap",
        "t_compute_s",
        "t_comm_exposed_s",
        "window_s",
        "buckets_early");
    for (const auto& [name, f] :
         {std::pair<const char*, const Figures&>{"off", off}, {"on", on}}) {
      std::printf(
          "%-8s %12.4f %16.4f %10.4f %14.1f\n",
          name,
          f.compute_s,
          f.exposed_s,
          f.window_s,
          f.early);
    }
    if (!csv.empty()) {
      std::ofstream out(csv);
      out << "overlap,ranks,grad_mib,buckets,t_compute_s,t_comm_exposed_s,"
             "window_s,buckets_early\n";
      for (const auto& [name, f] :
           {std::pair<const char*, const Figures&>{"off", off}, {"on", on}}) {
        out << name << "," << world << "," << f.grad_bytes / 1048576.0 << ","
            << f.buckets << "," << f.compute_s << "," << f.exposed_s << ","
            << f.window_s << "," << f.early << "\n";
      }
    }
  }
  const bool ok = diff < 1e-5;
  MPI_Finalize();
  if (!ok && rank == 0)
    std::fprintf(stderr, "bench_overlap: overlap changed the update\n");
  return ok ? 0 : 1;
}
