// bench_memory: peak device bytes and time per window for the models that
// exist, across activation checkpointing (off / selective / all / auto),
// AMP (off / bf16) and micro-batch sizes. One rank (the memory of one rank is
// what a budget limits). Prints a table and writes CSV.
//
//   bench_memory [-b 64] [-e 1024] [-f 4] [-w 1] [-n 3] [-c 1]
//                [--models mlp,cnn] [--amp off,bf16] [--device cpu|cuda]
//                [--image-size 224] [--resnet-micro 8]
//                [--volume-size 64] [--unet-micro 2] [--csv FILE]
//   -b/-e/-f  micro-batch sweep of mlp and cnn: begin, end, factor
//   models    also unet3d (feature_size 16, depth 3, instance norm, one
//             patch = a whole volume of --volume-size^3) and
//             seresnext50_32x4d (--image-size^2 RGB images, 10 classes),
//             each at its own micro-batch
//   -w        warm-up windows (not timed)   -n  timed windows
//   -c        check before timing: checkpointed weights equal un-checkpointed
// ckpt "auto:sel": the planner chose every segment selective.
//
// On the CPU "device" bytes are the accounting allocator's device domain
// (DESIGN.md); with --device cuda (a CUDA build) the caching allocator's.

#include <mpi.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "memtrain/data/synthetic.h"
#include "memtrain/device/placement.h"
#include "memtrain/dist/cpu_threads.h"
#include "memtrain/dist/environment.h"
#include "memtrain/dist/mpi_communicator.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/train/loop/trainer.h"
#include "memtrain/util/error.h"

using namespace memtrain;

namespace {

struct Row {
  std::string model, ckpt, amp;
  int64_t micro = 0;
  int64_t segments = 0;
  int64_t peak = 0;
  double window_ms = 0;
  double samples_per_s = 0;
};

struct Result {
  Row row;
  NamedTensors params;
};

const Placement* g_placement = nullptr;  // chosen once from --device

Result run(
    const TrainConfig& base,
    Checkpointing ckpt,
    const std::string& amp,
    int64_t micro,
    int64_t windows,
    int64_t warmup) {
  TrainConfig c = base;
  c.data.batch_size = micro;
  c.training.gradient_checkpointing = ckpt;
  c.training.amp = choice_of<Amp>(amp);
  c.training.max_windows = windows + warmup;
  c.training.epochs = 1 << 20;
  MpiCommunicator comm(MPI_COMM_SELF);
  Trainer::Options opts;
  opts.write_outputs = false;
  opts.placement = g_placement;
  Trainer t(c, comm, opts);
  t.prepare();
  const TrainSummary s = t.run();
  Result r;
  r.row.model = to_string(c.model.name);
  r.row.ckpt = to_string(ckpt);
  if (ckpt == Checkpointing::kAuto && t.selective_recompute())
    r.row.ckpt += ":sel";  // auto chose every segment selective
  r.row.amp = to_string(c.training.amp);
  r.row.micro = micro;
  r.row.segments = t.checkpointed_segments();
  double secs = 0;
  for (size_t i = 0; i < s.window_results.size(); ++i) {
    const auto& w = s.window_results[i];
    r.row.peak = std::max(r.row.peak, w.mem_peak);
    if (static_cast<int64_t>(i) >= warmup)
      secs += w.seconds;
  }
  r.row.window_ms = 1e3 * secs / static_cast<double>(windows);
  r.row.samples_per_s = static_cast<double>(micro * windows) / secs;
  for (auto& [n, p] : t.named_parameters()) {
    r.params.emplace_back(n, p.detach().clone());
  }
  return r;
}

double max_diff(const NamedTensors& a, const NamedTensors& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, (a[i].second - b[i].second).abs().max().item<double>());
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  CLI::App app{"bench_memory: peak device bytes and time per window"};
  int64_t begin = 64, end = 1024, factor = 4, warmup = 1, iters = 3;
  int check = 1;
  std::string models = "mlp,cnn", csv = "bench_memory.csv", device = "cpu";
  std::string amps = "off,bf16";
  int64_t image_size = 224, resnet_micro = 8, volume_size = 64, unet_micro = 2;
  app.add_option("--device", device, "cpu, or cuda (a CUDA build)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("-b", begin, "smallest micro-batch")->capture_default_str();
  app.add_option("-e", end, "largest micro-batch")->capture_default_str();
  app.add_option("-f", factor, "micro-batch factor")->capture_default_str();
  app.add_option("-w", warmup, "warm-up windows")->capture_default_str();
  app.add_option("-n", iters, "timed windows")->capture_default_str();
  app.add_option("-c", check, "check before timing (0/1)")
      ->capture_default_str();
  app.add_option("--models", models, "of mlp, cnn, unet3d, seresnext50_32x4d")
      ->capture_default_str();
  app.add_option("--amp", amps, "of off, bf16")->capture_default_str();
  app.add_option("--image-size", image_size, "seresnext50_32x4d: H = W")
      ->capture_default_str();
  app.add_option("--resnet-micro", resnet_micro, "seresnext50_32x4d")
      ->capture_default_str();
  app.add_option("--volume-size", volume_size, "unet3d: D = H = W")
      ->capture_default_str();
  app.add_option("--unet-micro", unet_micro, "unet3d")->capture_default_str();
  app.add_option("--csv", csv, "CSV output file")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    MPI_Finalize();
    return rc;
  }
  {  // threads per rank as the trainer sets them (Note [Threads per rank])
    Environment env(nullptr, nullptr);  // MPI is initialised: not owned
    configure_cpu_threads(env);
  }
  int rc = 0;
  try {
    // Before any tensor: the device decides which memory backend counts.
    const auto placement = Placement::choose(
        choice_of<DeviceChoice>(device),
        0,
        TrainConfig().memory.allocator_conf);
    g_placement = placement.get();
    char dir[] = "/tmp/bench_memory-XXXXXX";
    MT_CHECK(mkdtemp(dir) != nullptr, "cannot make a temp folder");
    const int64_t samples = std::max<int64_t>(end * (iters + warmup), 256);
    SyntheticSpec f;
    f.samples = samples;
    f.features = 64;
    make_synthetic(f, std::string(dir) + "/features.h5");
    SyntheticSpec im;
    im.kind = "images";
    im.samples = samples;
    im.height = im.width = 32;
    make_synthetic(im, std::string(dir) + "/images.h5");
    const auto wanted = [&models](const std::string& m) {
      return ("," + models + ",").find("," + m + ",") != std::string::npos;
    };
    if (wanted("seresnext50_32x4d")) {
      SyntheticSpec big = im;
      big.samples = resnet_micro * (iters + warmup);
      big.classes = 10;
      big.height = big.width = image_size;
      make_synthetic(big, std::string(dir) + "/big_images.h5");
    }
    if (wanted("unet3d")) {
      SyntheticSpec v;
      v.kind = "volumes";
      v.samples = unet_micro * (iters + warmup);
      v.channels = 1;
      v.classes = 2;
      v.depth = v.height = v.width = volume_size;
      make_synthetic(v, std::string(dir) + "/volumes.h5");
    }

    std::printf(
        "# bench_memory: device %s (%s), world 1, %d threads\n",
        placement->describe().c_str(),
        memory::backend_name().c_str(),
        torch::get_num_threads());
    std::printf(
        "# %-17s %-9s %-5s %6s %5s %12s %10s %12s %7s %7s\n",
        "model",
        "ckpt",
        "amp",
        "micro",
        "segs",
        "peak_bytes",
        "window_ms",
        "samples/s",
        "peak/off",
        "time/off");
    std::ofstream out(csv);
    out << "model,checkpointing,amp,micro_batch,checkpointed_segments,"
           "peak_bytes,window_ms,samples_per_s,peak_vs_off,time_vs_off\n";
    std::stringstream model_list(models);
    for (std::string model; std::getline(model_list, model, ',');) {
      TrainConfig base;
      base.model.name = choice_of<ModelName>(model);
      const bool mlp = base.model.name == ModelName::kMlp;
      base.model.depth = mlp ? 16 : 4;
      base.model.hidden = mlp ? 64 : 16;
      base.data.train =
          std::string(dir) + (mlp ? "/features.h5" : "/images.h5");
      std::vector<int64_t> micros;
      for (int64_t micro = begin; micro <= end; micro *= factor)
        micros.push_back(micro);
      if (base.model.name == ModelName::kSeresnext50) {
        base.data.train = std::string(dir) + "/big_images.h5";
        micros = {resnet_micro};
      } else if (base.model.name == ModelName::kUnet3d) {
        base.model.depth = 3;
        base.model.feature_size = 16;
        base.model.norm = Norm::kInstance;
        base.data.train = std::string(dir) + "/volumes.h5";
        base.data.patch_size = {volume_size, volume_size, volume_size};
        base.data.patches_per_volume = 1;
        micros = {unet_micro};
      }
      base.data.val = "";
      base.training.momentum = 0.9;
      base.output.dir = dir;
      base.dist.check_replicas = CheckReplicas::kOff;
      for (int64_t micro : micros) {
        std::stringstream amp_list(amps);
        for (std::string amp; std::getline(amp_list, amp, ',');) {
          Result off =
              run(base, Checkpointing::kOff, amp, micro, iters, warmup);
          Result selective =
              run(base, Checkpointing::kSelective, amp, micro, iters, warmup);
          Result all =
              run(base, Checkpointing::kAll, amp, micro, iters, warmup);
          if (check) {
            for (const Result* r : {&selective, &all}) {
              const double d = max_diff(off.params, r->params);
              MT_CHECK(
                  d < 1e-5,
                  "check failed: ",
                  model,
                  " micro ",
                  micro,
                  " amp ",
                  amp,
                  ": ",
                  r->row.ckpt,
                  " checkpointed weights differ by ",
                  d);
            }
          }
          // auto: a budget halfway between the two peaks; it must pick
          // some segments, not all.
          TrainConfig budgeted = base;
          budgeted.memory.budget =
              std::to_string((off.row.peak + all.row.peak) / 2 * 10 / 9 + 1);
          budgeted.memory.headroom = 0.1;
          Result automatic =
              run(budgeted, Checkpointing::kAuto, amp, micro, iters, warmup);
          for (const Result* r : {&off, &selective, &all, &automatic}) {
            const Row& row = r->row;
            // Against checkpointing off in the same run.
            const double peak_x = static_cast<double>(row.peak) /
                                  static_cast<double>(off.row.peak);
            const double time_x = row.window_ms / off.row.window_ms;
            std::printf(
                "  %-17s %-9s %-5s %6ld %5ld %12ld %10.2f %12.2f %7.3f "
                "%7.3f\n",
                row.model.c_str(),
                row.ckpt.c_str(),
                row.amp.c_str(),
                static_cast<long>(row.micro),
                static_cast<long>(row.segments),
                static_cast<long>(row.peak),
                row.window_ms,
                row.samples_per_s,
                peak_x,
                time_x);
            out << row.model << "," << row.ckpt << "," << row.amp << ","
                << row.micro << "," << row.segments << "," << row.peak << ","
                << row.window_ms << "," << row.samples_per_s << "," << peak_x
                << "," << time_x << "\n";
          }
        }
      }
    }
    std::printf(
        "# check: %s; CSV: %s\n",
        check ? "checkpointed weights equal un-checkpointed (< 1e-5)"
              : "skipped",
        csv.c_str());
    std::filesystem::remove_all(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_memory: error: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
