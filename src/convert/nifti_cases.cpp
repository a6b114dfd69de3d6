#include "memtrain/convert/nifti_cases.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "memtrain/util/error.h"
#include "memtrain/util/file_kind.h"

namespace memtrain {

namespace fs = std::filesystem;

std::string nifti_stem(const std::string& file_name) {
  for (const std::string e : kNiftiEndings) {
    if (file_name.size() > e.size() &&
        file_name.compare(file_name.size() - e.size(), e.size(), e) == 0)
      return file_name.substr(0, file_name.size() - e.size());
  }
  return "";
}

int64_t nnunet_channel(const std::string& stem, std::string* base) {
  const size_t n = stem.size();
  if (n < 6 || stem[n - 5] != '_' ||
      !std::all_of(stem.end() - 4, stem.end(), [](unsigned char d) {
        return d >= '0' && d <= '9';
      }))
    return -1;
  *base = stem.substr(0, n - 5);
  return std::stoll(stem.substr(n - 4));
}

std::vector<std::string> NiftiFolder::names() const {
  std::set<std::string> all;
  for (const auto& [n, f] : single)
    all.insert(n);
  for (const auto& [n, f] : channels)
    all.insert(n);
  return {all.begin(), all.end()};
}

namespace {

// Records `path` as `slot`, refusing a second file for it.
void put(
    std::string& slot,
    const std::string& path,
    const std::string& what,
    const std::string& who) {
  if (!slot.empty()) {
    const auto [a, b] = std::minmax(slot, path);
    throw Error(detail::concat(
        who,
        ": '",
        a,
        "' and '",
        b,
        "' are both ",
        what,
        "; keep one (which is read would depend on the folder's order)"));
  }
  slot = path;
}

}  // namespace

NiftiFolder index_nifti_folder(
    const std::string& dir, OddEntry odd, const std::string& who) {
  NiftiFolder ix;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return ix;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string path = it->path().string();
    const std::string n = it->path().filename().string();
    const std::string stem = nifti_stem(n);
    if (n[0] == '.' || stem.empty())
      continue;  // hidden (macOS "._x.nii.gz" in MSD archives) or other
    std::error_code kind;
    if (!it->is_regular_file(kind)) {
      // "'X' is a directory, not a file", "'X': a FIFO, not a regular
      // file", "'X': cannot stat: ..."
      const std::string why = it->is_directory(kind)
                                  ? std::string(" is a directory, not a file")
                                  : ": " + not_a_regular_file(path);
      MT_CHECK(
          odd == OddEntry::kSkip,
          who,
          ": '",
          path,
          "'",
          why,
          " (a case file is expected there; the case would be dropped)");
      continue;
    }
    std::string name;
    const int64_t ch = nnunet_channel(stem, &name);
    if (ch >= 0) {
      put(ix.channels[name][ch],
          path,
          "case " + name + "'s channel " + std::to_string(ch) + " file",
          who);
    } else {
      put(ix.single[stem], path, "case " + stem + "'s file", who);
    }
  }
  MT_CHECK(!ec, who, ": cannot list '", dir, "': ", ec.message());
  return ix;
}

std::vector<InputCase> input_cases(
    const std::string& input, const std::string& who) {
  std::error_code ec;
  if (!fs::is_directory(input, ec)) {
    const std::string why = not_a_regular_file(input);
    MT_CHECK(
        why != "no such file",
        who,
        ": --input '",
        input,
        "': no such file or folder");
    MT_CHECK(why.empty(), who, ": --input '", input, "': ", why);
    const std::string stem = nifti_stem(fs::path(input).filename().string());
    MT_CHECK(
        !stem.empty(),
        who,
        ": --input '",
        input,
        "' is not a .nii or .nii.gz file");
    std::string base;
    return {{nnunet_channel(stem, &base) == 0 ? base : stem, {input}}};
  }
  const NiftiFolder ix = index_nifti_folder(input, OddEntry::kRefuse, who);
  std::vector<InputCase> cases;
  for (const std::string& name : ix.names()) {
    const auto s = ix.single.find(name);
    const auto c = ix.channels.find(name);
    if (s != ix.single.end()) {
      MT_CHECK(
          c == ix.channels.end(),
          who,
          ": --input '",
          input,
          "' holds two cases named '",
          name,
          "' (",
          fs::path(s->second).filename().string(),
          " and ",
          fs::path(c->second.begin()->second).filename().string(),
          "): their outputs would be one file");
      cases.push_back({name, {s->second}});
      continue;
    }
    InputCase k{name, {}};
    for (const auto& [ch, path] : c->second) {
      MT_CHECK(
          ch == static_cast<int64_t>(k.files.size()),
          who,
          ": --input '",
          input,
          "': case '",
          name,
          "' has ",
          fs::path(path).filename().string(),
          " but no channel ",
          k.files.size(),
          " file before it (nnU-Net names a case's channels CASE_0000, "
          "CASE_0001, ...)");
      k.files.push_back(path);
    }
    cases.push_back(std::move(k));
  }
  MT_CHECK(
      !cases.empty(),
      who,
      ": --input '",
      input,
      "' holds no .nii or .nii.gz file");
  return cases;
}

}  // namespace memtrain
