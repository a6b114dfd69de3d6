// convert-dataset: what dataset.json says (labels, channels, file ending,
// the cases it lists or counts), and its counts against the cases found.

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "convert/dataset_case.h"
#include "memtrain/formats/text/json_keys.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace fs = std::filesystem;
using nlohmann::json;
namespace {

constexpr const char* kCmd = "convert-dataset";

bool parse_int(const std::string& s, int64_t* out) {
  if (s.empty())
    return false;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (end != s.c_str() + s.size())
    return false;
  *out = v;
  return true;
}

// numTraining / numTest: -1 when absent; a whole number >= 0 else.
template <typename Bad>
int64_t count_field(const json& j, const char* key, const Bad& bad) {
  if (!j.contains(key))
    return -1;
  const json& v = j[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 0)
    throw bad(
        std::string("\"") + key + "\" is " + v.dump() +
        ", not a count of cases (a whole number >= 0)");
  return v.get<int64_t>();
}

}  // namespace

// A key written twice in an object is refused: JSON readers (nnU-Net's,
// Python's json) keep its last value silently.
json read_dataset_json(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  MT_CHECK(
      in.good(), kCmd, ": ", what, " '", path, "': no such file or unreadable");
  std::ostringstream text;
  text << in.rdbuf();
  std::optional<JsonKeyTwice> twice;
  json j;
  try {
    j = parse_json_keys_once(text.str(), &twice);
  } catch (const json::exception& e) {
    throw Error(
        std::string(kCmd) + ": " + what + " '" + path +
        "': not valid JSON: " + e.what());
  }
  if (twice)
    throw Error(
        std::string(kCmd) + ": " + what + " '" + path + "': key " +
        json(twice->key).dump() + " is written twice in " +
        (twice->top_level() ? std::string("the top-level object")
                            : "object " + twice->object) +
        " (a JSON reader keeps the last silently); keep one");
  return j;
}

DatasetMeta read_dataset_meta(const std::string& folder) {
  const std::string path = (fs::path(folder) / "dataset.json").string();
  const json j = read_dataset_json(path, "dataset.json");
  DatasetMeta m;
  auto bad = [&](const std::string& why) {
    return Error(std::string(kCmd) + ": '" + path + "': " + why);
  };
  if (!j.is_object() || !j.contains("labels") || !j["labels"].is_object() ||
      j["labels"].empty())
    throw bad("has no \"labels\" object");
  std::map<int64_t, std::string> labels;
  for (const auto& [key, v] : j["labels"].items()) {
    int64_t value = -1;
    std::string name;
    if (v.is_number_integer()) {  // nnU-Net v2: {"background": 0}
      value = v.get<int64_t>();
      name = key;
    } else if (v.is_string() && parse_int(key, &value)) {  // MSD: {"0": ...}
      name = v.get<std::string>();
    } else {
      throw bad(
          "labels entry \"" + key + "\": " + v.dump() +
          " is neither a value (nnU-Net v2: \"name\": 0) nor a name (MSD: "
          "\"0\": \"name\"); region labels (lists) are not supported");
    }
    if (labels.count(value))
      throw bad("label value " + std::to_string(value) + " is named twice");
    if (name.empty() || name.find(',') != std::string::npos)
      throw bad(
          "label " + std::to_string(value) + " is named '" + name +
          "'; class names must be non-empty, without commas (class_names "
          "is comma-separated)");
    labels[value] = name;
  }
  int64_t expect = 0;
  for (const auto& [value, name] : labels) {
    if (value != expect)
      throw bad(
          "label values must be 0..K-1 without gaps; " +
          std::to_string(expect) +
          " is missing (values: " + j["labels"].dump() + ")");
    m.class_names.push_back(name);
    ++expect;
  }
  if (m.class_names.size() < 2 || m.class_names.size() > 256)
    throw bad(
        "needs 2..256 labels (uint8 masks), has " +
        std::to_string(m.class_names.size()));
  const char* ckey = j.contains("channel_names") ? "channel_names"
                     : j.contains("modality")    ? "modality"
                                                 : nullptr;
  if (!ckey || !j[ckey].is_object() || j[ckey].empty())
    throw bad(
        "has no \"channel_names\" (nnU-Net v2) or \"modality\" (MSD) "
        "object");
  for (size_t c = 0; c < j[ckey].size(); ++c) {
    const std::string k = std::to_string(c);
    if (!j[ckey].contains(k))
      throw bad(
          std::string("\"") + ckey + "\" has no channel \"" + k +
          "\" (keys must be 0..C-1)");
    m.channels.push_back(
        j[ckey][k].is_string() ? j[ckey][k].get<std::string>()
                               : j[ckey][k].dump());
  }
  if (j.contains("file_ending")) {
    if (!j["file_ending"].is_string())
      throw bad("\"file_ending\" is not a string");
    m.ending = j["file_ending"].get<std::string>();
    if (m.ending != ".nii.gz" && m.ending != ".nii")
      throw bad("file_ending \"" + m.ending + "\": only .nii.gz and .nii");
  }
  if (j.contains("training") && j["training"].is_array() &&
      !j["training"].empty())
    m.training = j["training"];
  m.num_training = count_field(j, "numTraining", bad);
  m.num_test = count_field(j, "numTest", bad);
  if (j.contains("test") && j["test"].is_array())
    m.test_listed = static_cast<int64_t>(j["test"].size());
  return m;
}

void check_case_counts(
    const std::string& folder,
    const DatasetMeta& m,
    int64_t training_cases,
    int64_t imagests_cases) {
  const std::string path = (fs::path(folder) / "dataset.json").string();
  auto refuse = [&](const char* key,
                    int64_t said,
                    const std::string& found,
                    int64_t n,
                    const std::string& fix) {
    throw Error(
        std::string(kCmd) + ": '" + path + "': " + key + " is " +
        std::to_string(said) + " but " + found + " " + std::to_string(n) +
        " case(s); " + fix);
  };
  // The training cases: those "training" lists (MSD, nnU-Net v1), else
  // those found in imagesTr/ (nnU-Net v2, whose own check is the same).
  if (m.num_training >= 0 && m.num_training != training_cases) {
    const bool listed = !m.training.is_null();
    refuse(
        "numTraining",
        m.num_training,
        listed ? "its \"training\" list has" : "imagesTr/ holds",
        training_cases,
        listed
            ? "correct numTraining or the list"
            : "a case is missing or extra in imagesTr/ (CASE_0000" + m.ending +
                  " or CASE" + m.ending + " files), or numTraining is wrong");
  }
  // The test cases: those "test" lists, and those found in imagesTs/
  // (when the folder is there: test images are not needed to convert).
  if (m.num_test < 0)
    return;
  if (m.test_listed >= 0 && m.num_test != m.test_listed)
    refuse(
        "numTest",
        m.num_test,
        "its \"test\" list has",
        m.test_listed,
        "correct numTest or the list");
  if (imagests_cases >= 0 && m.num_test != imagests_cases)
    refuse(
        "numTest",
        m.num_test,
        "imagesTs/ holds",
        imagests_cases,
        "a test case is missing or extra in imagesTs/, or numTest is wrong");
}

}  // namespace memtrain
