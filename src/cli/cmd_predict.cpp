#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "agreed.h"
#include "commands.h"
#include "memtrain/data/h5_dataset.h"
#include "memtrain/data/nifti_cases.h"
#include "memtrain/data/nifti_volume.h"
#include "memtrain/data/seg_metrics.h"
#include "memtrain/dist/environment.h"
#include "memtrain/train/trainer.h"
#include "memtrain/util/atomic_file.h"
#include "memtrain/util/error.h"
#include "weights_run.h"

namespace memtrain::cli {
namespace {

namespace fs = std::filesystem;

// The label file of case `name`: --labels itself (a file, with one input
// case), or NAME.nii.gz / NAME.nii in the --labels folder.
std::string labels_of(const std::string& labels, const InputCase& in) {
  if (!fs::is_directory(labels))
    return labels;
  for (const char* ext : {".nii.gz", ".nii"}) {
    const fs::path p = fs::path(labels) / (in.name + ext);
    if (fs::exists(p))
      return p.string();
  }
  throw Error(
      "predict: --labels '" + labels + "' has no " + in.name +
      ".nii.gz or .nii for input '" + in.files[0] + "'");
}

std::string num(double v) {
  if (std::isinf(v))
    return "inf";
  std::ostringstream o;
  o.precision(6);
  o << v;
  return o.str();
}

struct CaseResult {
  std::string out;
  std::string csv;  // rows "case,class,dice,hd95_mm,pred_voxels,true_voxels"
  std::string line;
};

// One case: read, (ras) reorient to RAS as convert-dataset stored the
// training cases, resample to the training spacing, normalise, sliding
// window, probabilities back to the case's own spacing, argmax, the
// reorientation undone, NIfTI out on the case's own grid and header.
CaseResult predict_case(
    Trainer& trainer,
    const PredictArgs& args,
    const std::array<double, 3>& train_spacing,
    int64_t channels,
    bool ras,
    const InputCase& in) {
  const std::string& path = in.files[0];  // the reference grid and header
  NiftiCase c =
      read_nifti_case("predict", "--input", in.files, args.analyze_orientation);
  MT_CHECK(
      c.shape[0] == channels,
      "predict: --input '",
      path,
      "' (case '",
      in.name,
      "', ",
      in.files.size(),
      " file(s)) has ",
      c.shape[0],
      " channel(s); the model was trained on ",
      channels,
      " (data.train)");
  // The file's grid (D, H, W) and the grid predicted on before resampling:
  // the same, or (ras) reoriented.
  const std::array<int64_t, 3> file_dims = {c.shape[1], c.shape[2], c.shape[3]};
  const std::array<int64_t, 3> ijk = {c.shape[3], c.shape[2], c.shape[1]};
  Orientation orient;  // identity
  if (ras) {
    try {
      orient = io_orientation(c.affine);
    } catch (const Error& e) {
      throw Error("predict: --input '" + path + "': " + e.what());
    }
  }
  const std::array<int64_t, 3> rs = reoriented_shape(orient, ijk);
  const std::array<double, 3> rp = reoriented_spacing(
      orient, {c.spacing_mm[2], c.spacing_mm[1], c.spacing_mm[0]});
  const std::array<int64_t, 3> dims = {rs[2], rs[1], rs[0]};
  const std::array<double, 3> spacing = {rp[2], rp[1], rp[0]};
  c.voxels = reorient(c.voxels, c.shape[0], ijk, orient);
  std::array<double, 3> grid_spacing = spacing;
  bool resample = false;
  for (int a = 0; a < 3; ++a) {
    if (train_spacing[a] > 0 &&
        std::fabs(train_spacing[a] - spacing[a]) > 1e-3 * train_spacing[a])
      resample = true;
  }
  std::array<int64_t, 3> grid = dims;
  if (resample) {
    grid_spacing = train_spacing;
    grid = resampled_dims_within_memory(
        "predict",
        "--input '" + path + "' at data.train's spacing",
        dims,
        spacing,
        train_spacing,
        c.shape[0],
        "check data.train's spacing_mm");
    c.voxels = resample_linear(
        c.voxels, c.shape[0], dims, spacing, grid, train_spacing);
  }
  normalize_channels(&c.voxels, c.shape[0]);
  at::Tensor volume = torch::from_blob(
      c.voxels.data(),
      {c.shape[0], grid[0], grid[1], grid[2]},
      torch::kFloat32);
  const at::Tensor probs = trainer.predict_volume(volume).contiguous();
  const int64_t k = probs.size(0);
  std::vector<float> p(
      probs.data_ptr<float>(), probs.data_ptr<float>() + probs.numel());
  if (resample)
    p = resample_linear(p, k, grid, grid_spacing, dims, spacing);
  const size_t n = static_cast<size_t>(dims[0] * dims[1] * dims[2]);
  std::vector<uint8_t> labels(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t best = 0;
    for (int64_t j = 1; j < k; ++j) {
      if (p[j * n + i] > p[best * n + i])
        best = j;
    }
    labels[i] = static_cast<uint8_t>(best);
  }
  labels = reorient_back(labels, 1, ijk, orient);
  CaseResult r;
  r.out = (fs::path(args.out) / (in.name + ".nii.gz")).string();
  write_nifti_labels_like(path, labels, r.out, args.analyze_orientation);
  std::ostringstream line;
  line << in.name << ": " << ijk[0] << "x" << ijk[1] << "x" << ijk[2]
       << " voxels";
  if (!orient.identity())
    line << " (reoriented to RAS)";
  if (resample)
    line << " (predicted at " << grid[2] << "x" << grid[1] << "x" << grid[0]
         << ")";
  line << " -> " << r.out;
  if (!args.labels.empty()) {
    const std::vector<uint8_t> truth = read_nifti_case_labels(
        "predict",
        "--labels",
        labels_of(args.labels, in),
        path,
        args.label_map,
        args.analyze_orientation);
    for (const ClassMetrics& m :
         segmentation_metrics(labels, truth, file_dims, c.spacing_mm, k)) {
      r.csv += in.name + "," + std::to_string(m.cls) + "," + num(m.dice) + "," +
               num(m.hd95_mm) + "," + std::to_string(m.pred_voxels) + "," +
               std::to_string(m.true_voxels) + "\n";
      line << "; class " << m.cls << " Dice " << num(m.dice) << ", HD95 "
           << num(m.hd95_mm) << " mm";
    }
  }
  r.line = line.str();
  return r;
}

}  // namespace

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
         "a weights file (model.safetensors, best.safetensors)")
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
      "file of each case's name");
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
  TrainConfig cfg;
  std::vector<InputCase> cases;
  std::array<double, 3> spacing{0, 0, 0};
  int64_t channels = 0;
  bool ras = false;
  if (!agreed(env, "config", [&] {
        cfg = TrainConfig::load(args.config, args.overrides);
        cfg.data.val = "";  // predict reads only --input
        MT_CHECK(
            cfg.model.name == "unet3d",
            "predict: model.name=",
            cfg.model.name,
            "; predict segments volumes with a unet3d config");
        cases = input_cases(args.input, "predict");
        // Every input's header before any output is written.
        if (!args.analyze_orientation.empty())
          check_axis_code("predict", args.analyze_orientation);
        std::vector<std::string> files;
        for (const InputCase& k : cases)
          files.insert(files.end(), k.files.begin(), k.files.end());
        const int64_t analyze = check_nifti_headers(
            "predict", "--input", files, args.analyze_orientation);
        if (!args.analyze_orientation.empty()) {
          MT_CHECK(
              analyze > 0,
              "predict: --analyze-orientation ",
              args.analyze_orientation,
              " is given but no --input file is an Analyze 7.5 file (all "
              "have the NIfTI magic and their own transforms); drop the "
              "option");
        }
        MT_CHECK(
            args.labels.empty() || fs::is_directory(args.labels) ||
                cases.size() == 1,
            "predict: --labels '",
            args.labels,
            "' is a file but --input holds ",
            cases.size(),
            " cases; give a folder of label files");
        const H5Dataset train = H5Dataset::open(cfg.data.train, "data.train");
        spacing = train.info().spacing_mm;
        channels = train.info().sample_shape[0];
        ras = train.info().orientation == "RAS";
        fs::create_directories(args.out);
      })) {
    return kExitUsage;
  }
  WeightsRun run;
  if (!start_weights_run(env, cfg, args.weights, &run))
    return kExitUsage;
  Trainer* trainer = run.trainer.get();
  std::string csv;
  if (!agreed(env, "predict", [&] {
        for (size_t i = env.rank(); i < cases.size(); i += env.world_size()) {
          const CaseResult r =
              predict_case(*trainer, args, spacing, channels, ras, cases[i]);
          std::printf("predict: [rank %d] %s\n", env.rank(), r.line.c_str());
          std::fflush(stdout);
          csv += r.csv;
        }
      })) {
    return kExitUsage;
  }
  const std::vector<std::string> parts = env.all_gather(csv);
  if (env.rank() == 0 && !args.labels.empty()) {
    std::string all = "case,class,dice,hd95_mm,pred_voxels,true_voxels\n";
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
