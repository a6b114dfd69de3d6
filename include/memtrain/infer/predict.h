#pragma once
// `memtrain predict`'s pipeline below the command line: the cases of
// --input, checked before any output is written, and one case from NIfTI
// in to a label map (and its metrics) out.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "memtrain/convert/nifti_cases.h"

namespace memtrain {

class InferenceModel;

struct PredictOptions {
  std::string input;                // a NIfTI file or a folder of them
  std::string out;                  // folder: OUT/CASE.nii.gz, metrics.csv
  std::string labels;               // "" or a file (one case) or a folder
  std::string label_map;            // --labels values to classes, e.g. >0:1
  std::string analyze_orientation;  // "" or an axis code, e.g. LAS
};

// The header of metrics.csv (written with --labels); CaseResult::csv rows
// follow it.
inline constexpr const char* kPredictMetricsHeader =
    "case,class,dice,hd95_mm,pred_voxels,true_voxels\n";

// --input's cases (input_cases: the case-listing rule convert-dataset
// uses), every file's header checked, --analyze-orientation checked
// against them, and a --labels file given only with one case. Writes
// nothing. Throws memtrain::Error naming the file or option.
std::vector<InputCase> predict_inputs(const PredictOptions& opt);

// The cases rank `rank` of `world` predicts: i = rank, rank + world, ...
std::vector<size_t> cases_of_rank(size_t count, int rank, int world);

// With --labels, the reference label file of each case this rank
// predicts (cases_of_rank), read and checked as predict_case scores it: found,
// on its case's grid and transform, and holding only the model's `num_classes`
// classes. Writes nothing: call it before any output. Throws
// memtrain::Error naming the file.
void check_reference_labels(
    const PredictOptions& opt,
    const std::vector<InputCase>& cases,
    int64_t num_classes,
    int rank,
    int world);

struct CaseResult {
  std::string out;   // OUT/CASE.nii.gz
  std::string csv;   // metrics.csv rows of the case (with --labels)
  std::string line;  // what was done, for the log
};

// One case: read, reoriented to RAS when data.train's orientation is RAS
// (as convert-dataset stored the training cases), resampled to the
// training spacing, z-scored per channel, run by the sliding window, the
// probabilities resampled back to the case's own spacing, argmax, the
// reorientation undone, written as NIfTI on the case's own grid and
// header (atomically); with --labels, Dice and HD95 per class. `rank`
// names this process in messages.
CaseResult predict_case(
    InferenceModel& model,
    const PredictOptions& opt,
    const InputCase& in,
    int rank);

}  // namespace memtrain
