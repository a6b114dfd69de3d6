#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>

#include "agreed.h"
#include "commands.h"
#include "load_config.h"
#include "memtrain/device/placement.h"
#include "memtrain/dist/environment.h"
#include "memtrain/infer/inference_model.h"
#include "memtrain/infer/predict.h"
#include "memtrain/util/atomic_file.h"
#include "memtrain/util/error.h"
#include "weights_run.h"

namespace memtrain::cli {

namespace fs = std::filesystem;

void add_predict(CLI::App& app, PredictArgs& args) {
  auto* cmd = app.add_subcommand(
      "predict",
      "Segment NIfTI volumes with trained weights: each case is resampled "
      "to the training data's voxel spacing (data.train's spacing_mm; "
      "first reoriented to RAS when data.train's orientation is RAS, as "
      "convert-dataset writes), z-scored per channel over its non-zero "
      "voxels (as convert-nifti and convert-dataset), run by the "
      "validator's sliding window (validation.roi, overlap, sw_batch, "
      "blend, offload), and its label map, brought back to the case's own "
      "grid, is written as OUT/CASE.nii.gz with the case's header "
      "(dimensions, voxel sizes, qform, sform). With --labels also Dice and "
      "HD95 (mm) per case and class in OUT/metrics.csv. Any world size "
      "(mpirun -np N): cases are split over ranks.");
  cmd->add_option("--config", args.config, "the training run's YAML config")
      ->check(CLI::ExistingFile);
  cmd->add_option(
         "--weights",
         args.weights,
         "a weights file (model.safetensors, best.safetensors, or a state "
         "dict saved by torch.save: .pt/.pth), loaded strictly")
      ->required();
  cmd->add_option(
         "--input",
         args.input,
         "a NIfTI-1 or NIfTI-2 image (.nii, .nii.gz) or a folder of them; "
         "nnU-Net's channel files CASE_0000, CASE_0001, ... are one case, "
         "written as CASE.nii.gz")
      ->required();
  cmd->add_option("--out", args.out, "output folder (created)")->required();
  cmd->add_option(
      "--labels",
      args.labels,
      "reference label maps: a file (one --input file) or a folder with a "
      "file of each case's name, holding only the model's classes (each is "
      "checked before any output is written)");
  cmd->add_option(
      "--label-map",
      args.label_map,
      "--labels values to classes, as convert-nifti's --label-map (e.g. "
      "'>0:1')");
  cmd->add_option(
      "--analyze-orientation",
      args.analyze_orientation,
      "accept inputs without the NIfTI magic (Analyze 7.5; refused without "
      "it) whose voxel axes i, j, k run toward these directions, e.g. LAS "
      "(nibabel's aff2axcodes)");
  accept_overrides(cmd, args.overrides);
}

int run_predict(const PredictArgs& args, int* argc, char*** argv) {
  Environment env(argc, argv);
  if (!start_ranks(env))
    return kExitUsage;
  PredictOptions opt;
  opt.input = args.input;
  opt.out = args.out;
  opt.labels = args.labels;
  opt.label_map = args.label_map;
  opt.analyze_orientation = args.analyze_orientation;
  TrainConfig cfg;
  TrainedOn on;
  std::vector<InputCase> cases;
  if (!agreed(env, "config", [&] {
        cfg = load_config(args.config, args.overrides);
        on = trained_on(cfg, "predict");
        cases = predict_inputs(opt);  // every header before any output
        check_reference_labels(
            opt, cases, on.num_classes, env.rank(), env.world_size());
        std::error_code ec;
        fs::create_directories(args.out, ec);
        MT_CHECK(
            !ec,
            "predict: cannot create --out '",
            args.out,
            "': ",
            ec.message());
      })) {
    return kExitUsage;
  }
  env.set_collective_timeout(cfg.dist.timeout_s);
  std::unique_ptr<Placement> placement;
  std::unique_ptr<InferenceModel> model;
  if (!agreed(
          env,
          "dist",
          [&] {
            placement = Placement::choose(
                cfg.dist.device, env.local_rank(), cfg.memory.allocator_conf);
          }) ||
      !agreed(
          env,
          "start-up",
          [&] {
            model = std::make_unique<InferenceModel>(cfg, on, *placement);
          }) ||
      !agreed(env, "--weights", [&] {
        model->load_weights(args.weights, "--weights");
      })) {
    return kExitUsage;
  }
  std::string csv;
  if (!agreed(env, "predict", [&] {
        for (const size_t i :
             cases_of_rank(cases.size(), env.rank(), env.world_size())) {
          const CaseResult r = predict_case(*model, opt, cases[i], env.rank());
          std::printf("predict: [rank %d] %s\n", env.rank(), r.line.c_str());
          std::fflush(stdout);
          csv += r.csv;
        }
      })) {
    return kExitUsage;
  }
  const std::vector<std::string> parts = env.all_gather(csv);
  if (env.rank() == 0 && !args.labels.empty()) {
    std::string all = kPredictMetricsHeader;
    for (const std::string& p : parts)
      all += p;
    const std::string path = (fs::path(args.out) / "metrics.csv").string();
    write_file_atomically(path, all);
    std::printf(
        "predict: %zu case(s); per case and class: %s\n",
        cases.size(),
        path.c_str());
  } else if (env.rank() == 0) {
    std::printf(
        "predict: %zu case(s) into %s\n", cases.size(), args.out.c_str());
  }
  return kExitOk;
}

}  // namespace memtrain::cli
