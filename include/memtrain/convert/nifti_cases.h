#pragma once
// The one rule that lists the NIfTI cases of a folder, used by
// convert-dataset (imagesTr/, imagesTs/) and predict (--input). A case is
// one file, CASE.nii.gz (the Decathlon's), or nnU-Net's one file per
// channel, CASE_0000.nii.gz, CASE_0001.nii.gz, ... Either ending, .nii.gz
// or .nii. No LibTorch here.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace memtrain {

// The endings of a NIfTI file, the longer first.
inline constexpr const char* kNiftiEndings[] = {".nii.gz", ".nii"};

// "x.nii.gz" -> "x", "x.nii" -> "x"; "" for any other name (a bare
// ".nii.gz" too).
std::string nifti_stem(const std::string& file_name);

// nnU-Net's channel files: "case_0001" (a stem) -> 1 with *base = "case";
// -1 (and *base untouched) without a "_DDDD" suffix.
int64_t nnunet_channel(const std::string& stem, std::string* base);

// What to do with a directory, FIFO, link loop or dead link named like a
// case file: refuse the folder, or leave the entry out.
enum class OddEntry { kRefuse, kSkip };

// A folder's case files by case name.
struct NiftiFolder {
  std::map<std::string, std::map<int64_t, std::string>> channels;
  std::map<std::string, std::string> single;
  std::vector<std::string> names() const;  // every case, sorted, once
};

// Lists `dir` (no such folder: an empty listing). Hidden files (the
// Decathlon archives' macOS "._CASE.nii.gz") and other endings are left
// out; one stem found with both endings (x.nii and x.nii.gz) is refused:
// which file is the case would depend on the directory's order. Throws
// memtrain::Error whose text starts with `who`, never a filesystem_error.
NiftiFolder index_nifti_folder(
    const std::string& dir, OddEntry odd, const std::string& who);

// A case to predict: its name (the output's, NAME.nii.gz) and its files,
// one or channels 0..C-1 in order.
struct InputCase {
  std::string name;
  std::vector<std::string> files;
};

// predict's --input: one file (CASE_0000.nii.gz is case CASE) or a
// folder's cases in name order, odd entries refused. Refuses a folder with
// no case, a case whose channels have a gap, and a name that is both a
// single file and channel files (their outputs would be one file).
std::vector<InputCase> input_cases(
    const std::string& input, const std::string& who);

}  // namespace memtrain
