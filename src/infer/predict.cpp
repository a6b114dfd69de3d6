#include "memtrain/infer/predict.h"

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <sstream>

#include "memtrain/formats/nifti/nifti_volume.h"
#include "memtrain/formats/nifti/orientation.h"
#include "memtrain/infer/inference_model.h"
#include "memtrain/metrics/seg_metrics.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

namespace fs = std::filesystem;

// The label file of case `name`: --labels itself (a file, with one input
// case), or NAME.nii.gz / NAME.nii in the --labels folder.
std::string labels_of(const std::string& labels, const InputCase& in) {
  std::error_code ec;
  if (!fs::is_directory(labels, ec))
    return labels;
  for (const char* ext : kNiftiEndings) {
    const fs::path p = fs::path(labels) / (in.name + ext);
    if (fs::exists(p, ec))
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

}  // namespace

std::vector<InputCase> predict_inputs(const PredictOptions& args) {
  std::vector<InputCase> cases = input_cases(args.input, "predict");
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
  std::error_code ec;
  MT_CHECK(
      args.labels.empty() || fs::is_directory(args.labels, ec) ||
          cases.size() == 1,
      "predict: --labels '",
      args.labels,
      "' is a file but --input holds ",
      cases.size(),
      " cases; give a folder of label files");
  return cases;
}

std::vector<size_t> cases_of_rank(size_t count, int rank, int world) {
  std::vector<size_t> mine;
  for (size_t i = static_cast<size_t>(rank); i < count;
       i += static_cast<size_t>(world))
    mine.push_back(i);
  return mine;
}

void check_reference_labels(
    const PredictOptions& args,
    const std::vector<InputCase>& cases,
    int64_t num_classes,
    int rank,
    int world) {
  if (args.labels.empty())
    return;
  for (const size_t i : cases_of_rank(cases.size(), rank, world))
    read_nifti_case_labels(
        "predict",
        "--labels",
        labels_of(args.labels, cases[i]),
        cases[i].files[0],
        args.label_map,
        num_classes,
        args.analyze_orientation);
}

CaseResult predict_case(
    InferenceModel& model,
    const PredictOptions& args,
    const InputCase& in,
    int rank) {
  const DatasetInfo& trained = model.trained_on().data;
  const std::array<double, 3>& train_spacing = trained.spacing_mm;
  const int64_t channels = trained.sample_shape[0];
  const bool ras = trained.orientation == "RAS";
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
  const at::Tensor probs =
      model.predict_volume(volume, "predict: case '" + in.name + "'", rank)
          .contiguous();
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
        k,
        args.analyze_orientation);
    for (const ClassMetrics& m : segmentation_metrics(
             labels,
             truth,
             file_dims,
             c.spacing_mm,
             k,
             dice_rule(model.config().validation))) {
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

}  // namespace memtrain
