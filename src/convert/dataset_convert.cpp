// memtrain convert-dataset: a Decathlon / nnU-Net folder to two ragged
// volume files. This file finds the cases, checks their headers and
// draws the split; dataset_meta.cpp reads dataset.json, dataset_write.cpp
// reads each case's voxels and writes the files. NIfTI reading:
// nifti_read.h.

#include "memtrain/convert/dataset_convert.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "convert/dataset_case.h"
#include "formats/nifti/nifti_read.h"
#include "memtrain/convert/nifti_cases.h"
#include "memtrain/formats/nifti/nifti_volume.h"
#include "memtrain/util/counter_rng.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace fs = std::filesystem;
using nlohmann::json;
namespace {

constexpr const char* kCmd = "convert-dataset";

std::string channel_file(
    const fs::path& dir,
    const std::string& name,
    int64_t c,
    const std::string& ending) {
  char num[32];
  std::snprintf(num, sizeof(num), "_%04ld", static_cast<long>(c));
  return (dir / (name + num + ending)).string();
}

// The image files of case `name` in `ix`, checked against C channels.
std::vector<std::string> case_images(
    const NiftiFolder& ix,
    const fs::path& dir,
    const std::string& name,
    const DatasetMeta& m,
    bool* single) {
  const auto s = ix.single.find(name);
  const auto c = ix.channels.find(name);
  *single = s != ix.single.end();
  if (*single) {
    MT_CHECK(
        c == ix.channels.end(),
        kCmd,
        ": case ",
        name,
        ": has both '",
        s->second,
        "' (MSD, one file) and channel files '",
        c == ix.channels.end() ? "" : c->second.begin()->second,
        "' (nnU-Net); keep one");
    return {s->second};
  }
  const int64_t nc = static_cast<int64_t>(m.channels.size());
  std::vector<std::string> files;
  for (int64_t ch = 0; ch < nc; ++ch) {
    const bool has = c != ix.channels.end() && c->second.count(ch);
    MT_CHECK(
        has,
        kCmd,
        ": case ",
        name,
        ": missing channel ",
        ch,
        " (",
        m.channels[ch],
        ") file '",
        channel_file(dir, name, ch, m.ending),
        "'");
    files.push_back(c->second.at(ch));
  }
  for (const auto& [ch, path] : c->second)
    MT_CHECK(
        ch < nc,
        kCmd,
        ": case ",
        name,
        ": extra channel file '",
        path,
        "': dataset.json has ",
        nc,
        " channel(s) (0..",
        nc - 1,
        ")");
  return files;
}

std::vector<DatasetCase> list_cases(
    const std::string& folder, const DatasetMeta& m) {
  const fs::path root(folder);
  const fs::path images = root / "imagesTr";
  const NiftiFolder ix =
      index_nifti_folder(images.string(), OddEntry::kRefuse, kCmd);
  std::vector<DatasetCase> cases;
  auto add = [&](const std::string& name, const std::string& label) {
    DatasetCase c;
    c.name = name;
    c.images = case_images(ix, images, name, m, &c.single_file);
    c.label = label;
    std::error_code ec;
    MT_CHECK(
        !fs::is_directory(label, ec),
        kCmd,
        ": case ",
        name,
        ": label '",
        label,
        "' is a directory, not a file");
    MT_CHECK(
        fs::is_regular_file(label, ec),
        kCmd,
        ": case ",
        name,
        ": no label file '",
        label,
        "'");
    cases.push_back(std::move(c));
  };
  if (!m.training.is_null()) {  // MSD (and nnU-Net v1) list the cases
    for (const json& e : m.training) {
      MT_CHECK(
          e.is_object() && e.contains("image") && e["image"].is_string() &&
              e.contains("label") && e["label"].is_string(),
          kCmd,
          ": dataset.json: a \"training\" entry is not {\"image\": ..., "
          "\"label\": ...}: ",
          e.dump());
      const fs::path img(e["image"].get<std::string>());
      const std::string name = nifti_stem(img.filename().string());
      MT_CHECK(
          !name.empty(),
          kCmd,
          ": dataset.json: training image '",
          img.string(),
          "' is not a .nii.gz or .nii file");
      add(name, (root / e["label"].get<std::string>()).lexically_normal());
    }
  } else {
    for (const std::string& n : ix.names())
      add(n, (root / "labelsTr" / (n + m.ending)).string());
  }
  MT_CHECK(
      !cases.empty(),
      kCmd,
      ": --folder '",
      folder,
      "': no training case in imagesTr/ (files CASE_0000",
      m.ending,
      " or CASE",
      m.ending,
      ")");
  std::sort(cases.begin(), cases.end(), [](const auto& a, const auto& b) {
    return a.name < b.name;
  });
  for (size_t i = 1; i < cases.size(); ++i)
    MT_CHECK(
        cases[i].name != cases[i - 1].name,
        kCmd,
        ": case ",
        cases[i].name,
        " is listed twice");
  return cases;
}

std::array<double, 3> parse_spacing(const std::string& s) {
  std::array<double, 3> out{};
  std::istringstream in(s);
  std::string part;
  int n = 0;
  while (std::getline(in, part, ',')) {
    char* end = nullptr;
    const double v = std::strtod(part.c_str(), &end);
    MT_CHECK(
        n < 3 && !part.empty() && end == part.c_str() + part.size() &&
            std::isfinite(v) && v > 0,
        kCmd,
        ": --spacing '",
        s,
        "' is not D,H,W (three voxel sizes in mm, > 0) or median");
    out[n++] = v;
  }
  MT_CHECK(
      n == 3,
      kCmd,
      ": --spacing '",
      s,
      "' is not D,H,W (three voxel sizes in mm, > 0) or median");
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Case indices of the train and val files.
void draw_split(
    const DatasetConvertSpec& spec,
    const std::vector<DatasetCase>& cases,
    std::vector<size_t>* train,
    std::vector<size_t>* val) {
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < cases.size(); ++i)
    by_name[cases[i].name] = i;
  if (!spec.splits.empty()) {
    const json j = read_dataset_json(spec.splits, "--splits");
    MT_CHECK(
        j.is_array(),
        kCmd,
        ": --splits '",
        spec.splits,
        "' is not a list of {\"train\": [...], \"val\": [...]}");
    MT_CHECK(
        spec.fold >= 0 && spec.fold < static_cast<int64_t>(j.size()),
        kCmd,
        ": --fold ",
        spec.fold,
        " is out of range: --splits '",
        spec.splits,
        "' has ",
        j.size(),
        " fold(s) (0..",
        static_cast<int64_t>(j.size()) - 1,
        ")");
    const json& f = j[spec.fold];
    std::set<size_t> seen;
    for (const char* part : {"train", "val"}) {
      MT_CHECK(
          f.is_object() && f.contains(part) && f[part].is_array(),
          kCmd,
          ": --splits '",
          spec.splits,
          "': fold ",
          spec.fold,
          " has no \"",
          part,
          "\" list");
      for (const json& n : f[part]) {
        const std::string name =
            n.is_string() ? n.get<std::string>() : n.dump();
        const auto it = by_name.find(name);
        MT_CHECK(
            it != by_name.end(),
            kCmd,
            ": --splits '",
            spec.splits,
            "': fold ",
            spec.fold,
            " lists case '",
            name,
            "', which is not a training case of '",
            spec.folder,
            "'");
        MT_CHECK(
            seen.insert(it->second).second,
            kCmd,
            ": --splits '",
            spec.splits,
            "': fold ",
            spec.fold,
            " lists case '",
            name,
            "' twice");
        (std::string(part) == "train" ? train : val)->push_back(it->second);
      }
    }
  } else {
    std::vector<std::pair<uint64_t, size_t>> keys;
    for (size_t i = 0; i < cases.size(); ++i)
      keys.push_back({split_key(cases[i].name, spec.seed), i});
    std::sort(keys.begin(), keys.end(), [&](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first
                                : cases[a.second].name < cases[b.second].name;
    });
    const int64_t nval =
        val_count(static_cast<int64_t>(cases.size()), spec.val_fraction);
    for (size_t r = 0; r < keys.size(); ++r)
      (static_cast<int64_t>(r) < nval ? val : train)->push_back(keys[r].second);
  }
  std::sort(train->begin(), train->end());
  std::sort(val->begin(), val->end());
  std::ostringstream how;
  if (spec.splits.empty())
    how << "--val-fraction " << spec.val_fraction << " of " << cases.size()
        << " cases";
  else
    how << "fold " << spec.fold;
  MT_CHECK(
      !train->empty() && !val->empty(),
      kCmd,
      ": ",
      how.str(),
      " gives ",
      train->size(),
      " training and ",
      val->size(),
      " validation cases; both files need at least one");
}

}  // namespace

DatasetConvertResult convert_dataset(const DatasetConvertSpec& spec) {
  MT_CHECK(!spec.folder.empty(), kCmd, ": --folder is required");
  MT_CHECK(!spec.out.empty(), kCmd, ": --out is required");
  MT_CHECK(spec.chunk > 0, kCmd, ": --chunk ", spec.chunk, " must be > 0");
  MT_CHECK(
      spec.splits.empty() == (spec.fold < 0),
      kCmd,
      ": --splits and --fold go together");
  MT_CHECK(
      !spec.splits.empty() || (spec.val_fraction > 0 && spec.val_fraction < 1),
      kCmd,
      ": --val-fraction ",
      spec.val_fraction,
      " is not in (0, 1)");
  std::error_code ec;
  MT_CHECK(
      fs::is_directory(spec.folder, ec),
      kCmd,
      ": --folder '",
      spec.folder,
      "': no such folder");
  const bool median_spacing = spec.spacing.empty() || spec.spacing == "median";
  std::array<double, 3> target{};
  if (!median_spacing)
    target = parse_spacing(spec.spacing);

  const DatasetMeta m = read_dataset_meta(spec.folder);
  std::vector<DatasetCase> cases = list_cases(spec.folder, m);
  // imagesTs/ is counted, not converted; listed before anything is
  // written, as its refusals (one stem with both endings) must be.
  const fs::path ts = fs::path(spec.folder) / "imagesTs";
  const bool has_ts = fs::is_directory(ts, ec);
  const int64_t test_cases =
      has_ts ? static_cast<int64_t>(
                   index_nifti_folder(ts.string(), OddEntry::kSkip, kCmd)
                       .names()
                       .size())
             : 0;
  check_case_counts(
      spec.folder,
      m,
      static_cast<int64_t>(cases.size()),
      has_ts ? test_cases : -1);
  std::vector<size_t> train, val;
  draw_split(spec, cases, &train, &val);
  // Headers only: grids, transforms, orientations, spacings.
  std::vector<size_t> used(train);
  used.insert(used.end(), val.begin(), val.end());
  if (!spec.analyze_orientation.empty())
    check_axis_code(kCmd, spec.analyze_orientation);
  bool any_analyze = false;
  for (size_t i : used) {
    read_case_header(
        &cases[i],
        static_cast<int64_t>(m.channels.size()),
        spec.analyze_orientation);
    any_analyze = any_analyze || cases[i].analyze;
  }
  MT_CHECK(
      spec.analyze_orientation.empty() || any_analyze,
      kCmd,
      ": --analyze-orientation ",
      spec.analyze_orientation,
      " is given but no case file is an Analyze 7.5 file (all have the "
      "NIfTI magic and their own transforms); drop the option");
  if (median_spacing) {
    for (int a = 0; a < 3; ++a) {
      std::vector<double> v;
      for (size_t i : used)
        v.push_back(cases[i].ras_spacing_dhw[a]);
      target[a] = median(v);
    }
  }
  // Each case's grid at the target spacing must fit in memory (one case
  // is read, reoriented and resampled at a time).
  std::ostringstream remedy;
  remedy << (median_spacing ? "the cases' median spacing is " : "--spacing is ")
         << target[0] << "," << target[1] << "," << target[2]
         << " mm; pass a larger --spacing D,H,W";
  for (size_t i : used)
    cases[i].out_shape = resampled_dims_within_memory(
        kCmd,
        (median_spacing ? std::string("--spacing median")
                        : "--spacing " + spec.spacing) +
            " (case " + cases[i].name + ")",
        cases[i].ras_shape_dhw,
        cases[i].ras_spacing_dhw,
        target,
        static_cast<int64_t>(m.channels.size()),
        remedy.str());

  DatasetConvertResult r;
  r.spacing_mm = target;
  r.num_classes = static_cast<int64_t>(m.class_names.size());
  r.class_names = m.class_names;
  r.test_cases = test_cases;
  r.test_folder = has_ts ? ts.string() : "";
  DatasetWriteCommon common;
  common.channels = static_cast<int64_t>(m.channels.size());
  common.num_classes = r.num_classes;
  for (size_t c = 0; c < m.class_names.size(); ++c)
    common.class_names += (c ? "," : "") + m.class_names[c];
  common.spacing = target;
  common.chunk = spec.chunk;
  common.source = spec.folder;
  common.seed = spec.seed;
  common.val_fraction = spec.splits.empty() ? spec.val_fraction : -1;
  common.fold = spec.fold;
  common.analyze_orientation = spec.analyze_orientation;
  r.files = write_dataset_files(spec.out, cases, train, val, common);
  return r;
}

}  // namespace memtrain
