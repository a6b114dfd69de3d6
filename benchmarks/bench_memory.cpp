// bench_memory: peak device bytes, host offload bytes and time per window
// for the models that exist, across activation checkpointing tiers (off /
// selective / all / offload / auto), AMP (off / bf16) and micro-batch
// sizes. One rank (the memory of one rank is what a budget limits). Prints
// a table and writes CSV.
//
//   bench_memory [-b 64] [-e 1024] [-f 4] [-w 1] [-n 3] [-c 1]
//                [--models mlp,cnn] [--amp off,bf16] [--device cpu|cuda]
//                [--tiers off,selective,all,offload,auto]
//                [--image-size 224] [--resnet-micro 8]
//                [--volume-size 64] [--unet-micro 2] [--unet-feature 16]
//                [--unet-depth 3] [--swin-feature 48]
//                [--clip-variant ViT-B-32] [--clip-micro 16]
//                [--fsct-image-size 84] [--fsct-micro 1]
//                [--dino-variants vits16] [--dino-size 512]
//                [--dino-slices 128] [--dino-contexts 0,2]
//                [--dino-chunks 16] [--dino-micro 1]
//                [--fits v100-16gb] [--form faster|lean] [--csv FILE]
//   -b/-e/-f  micro-batch sweep of mlp and cnn: begin, end, factor
//   models    also unet3d (--unet-feature, --unet-depth, instance norm, one
//             patch = a whole volume of --volume-size^3), swin_unetr
//             (MONAI's SwinUNETR, --swin-feature, the same volumes and
//             micro-batches as unet3d) and
//             seresnext50_32x4d (--image-size^2 RGB images, 10 classes),
//             each at its own micro-batch (--unet-micro, --resnet-micro:
//             one or more, comma-separated); clip (open_clip's CLIP,
//             --clip-variant, --image-size^2 images with 77 tokens from
//             make-data --kind captions, --clip-micro pairs, exact
//             contrastive accumulation: the window's one micro-batch is
//             embedded without a graph and then run again with it) and
//             fsct (the few-shot cosine transformer on resnet50 as
//             launch/configs/fewshot-v100.yaml: 5-way 5-shot 16-query
//             episodes of --fsct-image-size^2 images, --fsct-micro
//             episodes a micro-batch; its samples/s are episodes/s) and
//             dino (Meta's DINOv3 ViT, frozen, random weights, on volumes
//             of --dino-slices slices of --dino-size^2, one volume a patch
//             and --dino-micro volumes a micro-batch; a row per variant,
//             context scale (0: none; the crop leaves the volume and is
//             read as 0 there) and model.slice_chunk (0: all of a
//             micro-batch's slices in one call); one tier: the head
//             has no segments and the backbone keeps no activations; its
//             samples/s are volumes/s, and a line gives each extraction's
//             peak and the milliseconds per volume)
//   -w        warm-up windows (not timed)   -n  timed windows
//   -c        check before timing: checkpointed weights equal
//             un-checkpointed (offload: equal to all)
//   --fits    a budget profile or size: a column says whether each row's
//             peak fits it (less memory.headroom 0.1, as the planner)
//   --form    a model with a lean and a faster form (the U-Net's decoder
//             input, SwinUNETR's attention on the CPU): faster, what a
//             run without memory.budget takes, or lean (Note [Planning the
//             faster form]); the auto rows, under their budget, the faster
//             where it fits (faster) or the lean (lean)
// ckpt "auto:sel": the planner chose every segment selective; "auto:off":
// it chose offload. time/off is per sample, against off at the same
// micro-batch and AMP.
//
// On the CPU "device" bytes are the accounting allocator's device domain
// (DESIGN.md); with --device cuda (a CUDA build) the caching allocator's.
// reserved: the device domain's reserved peak. The host at the window
// boundaries: rss_MiB, the largest resident set; out_MiB, what the process
// held outside the counted bytes before the row's run (after releasing the
// cache and trimming glibc's heap); rss/c+o, the largest resident set over
// counted + that outside (issue 53's goal: <= 1.05).

#include <mpi.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <thread>

#include "bench_memory_data.h"

#include "memtrain/device/placement.h"
#include "memtrain/dist/cpu_threads.h"
#include "memtrain/dist/environment.h"
#include "memtrain/dist/mpi_communicator.h"
#include "memtrain/memory/budget.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/memory/host_figures.h"
#include "memtrain/train/loop/trainer.h"
#include "memtrain/util/error.h"

using namespace memtrain;
using bench::wanted_in;

namespace {

struct Row {
  std::string model, ckpt, amp;
  int64_t micro = 0;
  int64_t segments = 0;
  int64_t peak = 0;
  int64_t host = 0;      // the host offload pool's peak
  int64_t reserved = 0;  // the device domain's reserved peak
  // The host at window boundaries (Note [Host figures]): the largest
  // resident set, what was outside the counted bytes before the run, and
  // the largest rss / (counted + that outside).
  int64_t rss = 0;
  int64_t outside = 0;
  double rss_ratio = 0;
  // The resident set at the boundary of the largest ratio, part by part
  // (metrics.jsonl's host_holders): counted, file-backed pages, glibc's
  // blocks nobody counts, glibc's free bytes, the rest (thread stacks,
  // untouched padding, what glibc's figures miss).
  int64_t worst_rss = 0, worst_counted = 0, worst_files = 0;
  int64_t worst_glibc_used = 0, worst_glibc_free = 0;
  // The same parts of the outside before the run.
  int64_t start_files = 0, start_glibc_used = 0;
  // dinov3: its extractions' peaks (mem_peak_backbone, mem_peak_context)
  // and the slices a backbone call took (0: another model).
  int64_t backbone_peak = 0, context_peak = 0, slice_chunk = 0;
  double window_ms = 0;
  double samples_per_s = 0;
};

struct Result {
  Row row;
  NamedTensors params;
};

const Placement* g_placement = nullptr;  // chosen once from --device
bool g_faster_forms = true;              // --form

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
  // What the process holds outside the counted bytes before the run: the
  // libraries, their heaps, what glibc keeps (trimmed first).
  memory::release_cache();
  memory::trim_host_heap();
  const memory::HostFigures start = memory::read_host_figures();
  MpiCommunicator comm(MPI_COMM_SELF);
  Trainer::Options opts;
  opts.write_outputs = false;
  opts.placement = g_placement;
  opts.faster_forms = g_faster_forms;
  Trainer t(c, comm, opts);
  t.prepare();
  const TrainSummary s = t.run();
  Result r;
  r.row.outside = start.rss - start.counted;
  r.row.start_files = start.rss_file;
  r.row.start_glibc_used = start.malloc_used - start.counted_host;
  r.row.model = to_string(c.model.name);
  if (c.model.name == ModelName::kClip)
    r.row.model += ":" + c.model.variant;
  if (c.model.head == Head::kCosineTransformer)
    r.row.model = "fsct:" + r.row.model;
  if (c.model.name == ModelName::kDinov3) {
    r.row.model += ":" + c.model.variant;
    if (c.model.context.scale > 0) {
      std::ostringstream scale;
      scale << c.model.context.scale;
      r.row.model += "+ctx" + scale.str();
    }
    // model.slice_chunk 0 (auto) without a budget: all of a micro-batch's
    // slices (slice_axis 0) in one call.
    const int64_t slices = micro * c.data.patch_size[0];
    r.row.slice_chunk = c.model.slice_chunk > 0
                            ? std::min(c.model.slice_chunk, slices)
                            : slices;
  }
  r.row.ckpt = to_string(ckpt);
  if (ckpt == Checkpointing::kAuto && t.selective_recompute())
    r.row.ckpt += ":sel";  // auto chose every segment selective
  if (ckpt == Checkpointing::kAuto && t.memory_plan().offload)
    r.row.ckpt += ":off";  // auto chose offload
  r.row.amp = to_string(c.training.amp);
  r.row.micro = micro;
  r.row.segments = t.checkpointed_segments();
  double secs = 0;
  for (size_t i = 0; i < s.window_results.size(); ++i) {
    const auto& w = s.window_results[i];
    r.row.peak = std::max(r.row.peak, w.mem_peak);
    r.row.host = std::max(r.row.host, w.host_peak);
    r.row.reserved = std::max(r.row.reserved, w.mem_peak_reserved);
    r.row.rss = std::max(r.row.rss, w.host_rss);
    for (const auto& [phase, bytes] : w.phase_peaks) {
      int64_t& to =
          phase == "context" ? r.row.context_peak : r.row.backbone_peak;
      to = std::max(to, bytes);
    }
    const double ratio = static_cast<double>(w.host_rss) /
                         static_cast<double>(w.host_counted + r.row.outside);
    if (ratio > r.row.rss_ratio) {
      r.row.rss_ratio = ratio;
      r.row.worst_rss = w.host_rss;
      r.row.worst_counted = w.host_counted;
      r.row.worst_files = w.host_rss_file;
      r.row.worst_glibc_used = w.host_malloc_used - w.host_counted_host;
      r.row.worst_glibc_free = w.host_malloc_free;
    }
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

// What every row of a sweep shares: the tiers to run (a comma list), the
// windows, whether to check the tiers' weights, the budget a row is read
// against.
struct Sweep {
  std::string tiers;
  int64_t iters = 0, warmup = 0;
  bool check = true;
  Budget fits;
};

// One row: the table's line and the CSV's, against off's row (`off`, or
// null) in the same run.
void print_row(
    const Row& row, const Row* off, const Budget& fits, std::ostream& out) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double peak_x =
      off ? static_cast<double>(row.peak) / static_cast<double>(off->peak)
          : nan;
  const double time_x = off ? row.window_ms / off->window_ms : nan;
  const char* fit = !fits.limited()             ? "-"
                    : row.peak <= fits.usable() ? "yes"
                                                : "no";
  constexpr double kMiB = 1 << 20;
  const auto mib = [](int64_t b) { return static_cast<double>(b) / kMiB; };
  std::printf(
      "  %-17s %-9s %-5s %6ld %5ld %12ld %12ld %12ld %10.2f %12.3f "
      "%7.3f %7.3f %4s %8.1f %8.1f %6.3f\n",
      row.model.c_str(),
      row.ckpt.c_str(),
      row.amp.c_str(),
      static_cast<long>(row.micro),
      static_cast<long>(row.segments),
      static_cast<long>(row.peak),
      static_cast<long>(row.reserved),
      static_cast<long>(row.host),
      row.window_ms,
      row.samples_per_s,
      peak_x,
      time_x,
      fit,
      mib(row.rss),
      mib(row.outside),
      row.rss_ratio);
  out << row.model << "," << row.ckpt << "," << row.amp << "," << row.micro
      << "," << row.segments << "," << row.peak << "," << row.reserved << ","
      << row.host << "," << row.window_ms << "," << row.samples_per_s << ","
      << peak_x << "," << time_x << "," << fit << "," << row.rss << ","
      << row.outside << "," << row.rss_ratio << "," << row.worst_rss << ","
      << row.worst_counted << "," << row.worst_files << ","
      << row.worst_glibc_used << "," << row.worst_glibc_free << ","
      << row.backbone_peak << "," << row.context_peak << "," << row.slice_chunk
      << "\n";
  std::printf(
      "    at its worst boundary: RSS %.1f MiB = counted %.1f + "
      "file-backed %.1f + glibc's uncounted blocks %.1f + glibc's "
      "free %.1f + the rest %.1f\n",
      mib(row.worst_rss),
      mib(row.worst_counted),
      mib(row.worst_files),
      mib(row.worst_glibc_used),
      mib(row.worst_glibc_free),
      mib(row.worst_rss - row.worst_counted - row.worst_files -
          row.worst_glibc_used - row.worst_glibc_free));
  std::printf(
      "    outside before the run %.1f MiB: file-backed %.1f, "
      "glibc's uncounted blocks %.1f, the rest %.1f\n",
      mib(row.outside),
      mib(row.start_files),
      mib(row.start_glibc_used),
      mib(row.outside - row.start_files - row.start_glibc_used));
  if (row.slice_chunk > 0) {
    std::printf(
        "    extraction peaks: backbone %ld B, context %ld B; %ld slices a "
        "backbone call; %.1f ms a volume\n",
        static_cast<long>(row.backbone_peak),
        static_cast<long>(row.context_peak),
        static_cast<long>(row.slice_chunk),
        row.window_ms / static_cast<double>(row.micro));
  }
}

// The rows of `base` at one micro-batch and AMP: each tier of sweep.tiers,
// their weights checked against the tier they must equal (selective and all
// against off, offload against all), and auto under a budget halfway
// between off's and all's peaks (it must pick some segments, not all).
void run_tiers(
    const TrainConfig& base,
    int64_t micro,
    const std::string& amp,
    const Sweep& sweep,
    std::ostream& out) {
  std::map<std::string, Result> by_tier;
  std::vector<const Result*> rows;
  std::stringstream tier_list(sweep.tiers);
  for (std::string tier; std::getline(tier_list, tier, ',');) {
    if (tier == "auto")
      continue;
    by_tier[tier] =
        run(base,
            choice_of<Checkpointing>(tier),
            amp,
            micro,
            sweep.iters,
            sweep.warmup);
    rows.push_back(&by_tier[tier]);
  }
  const auto check_against = [&](const char* tier, const char* ref) {
    if (!sweep.check || !by_tier.count(tier) || !by_tier.count(ref))
      return;
    const double d = max_diff(by_tier.at(ref).params, by_tier.at(tier).params);
    MT_CHECK(
        d < 1e-5,
        "check failed: ",
        by_tier.at(tier).row.model,
        " micro ",
        micro,
        " amp ",
        amp,
        ": ",
        tier,
        " weights differ from ",
        ref,
        "'s by ",
        d);
  };
  check_against("selective", "off");
  check_against("all", "off");
  check_against("offload", "all");
  if (wanted_in(sweep.tiers, "auto") && by_tier.count("off") &&
      by_tier.count("all")) {
    TrainConfig budgeted = base;
    budgeted.memory.budget = std::to_string(
        (by_tier.at("off").row.peak + by_tier.at("all").row.peak) / 2 * 10 / 9 +
        1);
    budgeted.memory.headroom = 0.1;
    by_tier["auto"] = run(
        budgeted, Checkpointing::kAuto, amp, micro, sweep.iters, sweep.warmup);
    rows.push_back(&by_tier["auto"]);
  }
  const Row* off = by_tier.count("off") ? &by_tier.at("off").row : nullptr;
  for (const Result* r : rows)
    print_row(r->row, off, sweep.fits, out);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  CLI::App app{"bench_memory: peak device bytes and time per window"};
  bench::ModelSizes sz;
  int64_t warmup = 1, iters = 3;
  int check = 1;
  std::string models = "mlp,cnn", csv = "bench_memory.csv", device = "cpu";
  std::string amps = "off,bf16", fits;
  std::string tiers = "off,selective,all,offload,auto";
  app.add_option("--device", device, "cpu, or cuda (a CUDA build)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("-b", sz.begin, "smallest micro-batch")->capture_default_str();
  app.add_option("-e", sz.end, "largest micro-batch")->capture_default_str();
  app.add_option("-f", sz.factor, "micro-batch factor")->capture_default_str();
  app.add_option("-w", warmup, "warm-up windows")->capture_default_str();
  app.add_option("-n", iters, "timed windows")->capture_default_str();
  app.add_option("-c", check, "check before timing (0/1)")
      ->capture_default_str();
  app.add_option(
         "--models",
         models,
         "of mlp, cnn, unet3d, swin_unetr, seresnext50_32x4d, clip, fsct, "
         "dino")
      ->capture_default_str();
  app.add_option("--amp", amps, "of off, bf16")->capture_default_str();
  app.add_option("--tiers", tiers, "of off, selective, all, offload, auto")
      ->capture_default_str();
  app.add_option(
         "--image-size", sz.image_size, "seresnext50_32x4d, clip: H = W")
      ->capture_default_str();
  app.add_option("--resnet-micro", sz.resnet_micros, "seresnext50_32x4d")
      ->capture_default_str();
  app.add_option("--volume-size", sz.volume_size, "unet3d: D = H = W")
      ->capture_default_str();
  app.add_option("--unet-micro", sz.unet_micros, "unet3d")
      ->capture_default_str();
  app.add_option(
         "--unet-feature", sz.unet_feature, "unet3d: model.feature_size")
      ->capture_default_str();
  app.add_option("--unet-depth", sz.unet_depth, "unet3d: model.depth")
      ->capture_default_str();
  app.add_option(
         "--swin-feature", sz.swin_feature, "swin_unetr: model.feature_size")
      ->capture_default_str();
  app.add_option("--clip-variant", sz.clip_variant, "clip: model.variant")
      ->capture_default_str();
  app.add_option("--clip-micro", sz.clip_micros, "clip: pairs")
      ->capture_default_str();
  app.add_option(
         "--fsct-image-size", sz.fsct_image_size, "fsct: episode images H = W")
      ->capture_default_str();
  app.add_option("--fsct-micro", sz.fsct_micros, "fsct: episodes")
      ->capture_default_str();
  app.add_option(
         "--dino-variants", sz.dino_variants, "dino: model.variant, a list")
      ->capture_default_str();
  app.add_option("--dino-size", sz.dino_size, "dino: slices' H = W")
      ->capture_default_str();
  app.add_option("--dino-slices", sz.dino_slices, "dino: a volume's D")
      ->capture_default_str();
  app.add_option(
         "--dino-contexts",
         sz.dino_contexts,
         "dino: model.context.scale, a list")
      ->capture_default_str();
  app.add_option(
         "--dino-chunks", sz.dino_chunks, "dino: model.slice_chunk, a list")
      ->capture_default_str();
  app.add_option("--dino-micro", sz.dino_micros, "dino: volumes")
      ->capture_default_str();
  app.add_option("--fits", fits, "a budget each row's peak is read against")
      ->capture_default_str();
  std::string form = "faster";
  app.add_option("--form", form, "faster or lean: a model's form")
      ->check(CLI::IsMember({"faster", "lean"}))
      ->capture_default_str();
  app.add_option("--csv", csv, "CSV output file")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    MPI_Finalize();
    return rc;
  }
  g_faster_forms = form == "faster";
  {  // threads per rank as the trainer sets them (Note [Threads per rank])
    Environment env(nullptr, nullptr);  // MPI is initialised: not owned
    configure_cpu_threads(env);
  }
  int rc = 0;
  std::string dir;  // the synthetic files; removed however the run ends
  try {
    // Before any tensor: the device decides which memory backend counts.
    const auto placement = Placement::choose(
        choice_of<DeviceChoice>(device),
        0,
        TrainConfig().memory.allocator_conf);
    g_placement = placement.get();
    char tmpl[] = "/tmp/bench_memory-XXXXXX";
    MT_CHECK(mkdtemp(tmpl) != nullptr, "cannot make a temp folder");
    dir = tmpl;
    sz.windows = iters + warmup;
    bench::make_model_data(sz, models, dir);

    std::printf(
        "# bench_memory: device %s (%s), world 1, %d threads\n",
        placement->describe().c_str(),
        memory::backend_name().c_str(),
        torch::get_num_threads());
    const Budget fit_budget =
        fits.empty() ? Budget{} : resolve_budget(fits, 0.1);
    if (fit_budget.limited()) {
      std::printf(
          "# fits: %s = %ld bytes, usable %ld (headroom 0.1)\n",
          fits.c_str(),
          static_cast<long>(fit_budget.bytes),
          static_cast<long>(fit_budget.usable()));
    }
    std::printf(
        "# %-17s %-9s %-5s %6s %5s %12s %12s %12s %10s %12s %7s %7s %4s "
        "%8s %8s %6s\n",
        "model",
        "ckpt",
        "amp",
        "micro",
        "segs",
        "peak_bytes",
        "reserved",
        "host_bytes",
        "window_ms",
        "samples/s",
        "peak/off",
        "time/off",
        "fits",
        "rss_MiB",
        "out_MiB",
        "rss/c+o");
    std::ofstream out(csv);
    out << "model,checkpointing,amp,micro_batch,checkpointed_segments,"
           "peak_bytes,reserved_bytes,host_bytes,window_ms,samples_per_s,"
           "peak_vs_off,time_vs_off,fits,rss_bytes,outside_bytes,"
           "rss_vs_counted_outside,worst_rss_bytes,worst_counted_bytes,"
           "worst_file_bytes,worst_glibc_uncounted_bytes,"
           "worst_glibc_free_bytes,backbone_peak_bytes,context_peak_bytes,"
           "slice_chunk\n";
    Sweep sweep;
    sweep.iters = iters;
    sweep.warmup = warmup;
    sweep.check = check != 0;
    sweep.fits = fit_budget;
    std::stringstream model_list(models);
    for (std::string model; std::getline(model_list, model, ',');) {
      std::vector<int64_t> micros;
      for (const TrainConfig& base :
           bench::model_configs(model, sz, dir, &micros)) {
        // dinov3: one tier (the head has no segments, the frozen backbone
        // keeps no activations).
        sweep.tiers = base.model.name == ModelName::kDinov3 ? "off" : tiers;
        for (int64_t micro : micros) {
          std::stringstream amp_list(amps);
          for (std::string amp; std::getline(amp_list, amp, ',');)
            run_tiers(base, micro, amp, sweep, out);
        }
      }
    }
    std::printf(
        "# check: %s; CSV: %s\n",
        check ? "selective and all weights equal off's, offload's equal all's "
                "(< 1e-5)"
              : "skipped",
        csv.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_memory: error: %s\n", e.what());
    rc = 1;
  }
  if (!dir.empty())
    std::filesystem::remove_all(dir);
  MPI_Finalize();
  return rc;
}
