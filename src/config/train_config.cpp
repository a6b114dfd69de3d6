#include "memtrain/config/train_config.h"

#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "key_table.h"
#include "memtrain/util/error.h"
#include "memtrain/util/file_kind.h"

namespace memtrain {
namespace {

void apply_tree(
    TrainConfig& cfg,
    const YAML::Node& node,
    const std::string& prefix,
    const std::string& origin) {
  // yaml-cpp keeps every entry of a mapping and this loop would apply each,
  // so a key (or section) written twice would silently take its last value.
  std::map<std::string, int> seen;  // key -> its first line
  for (const auto& item : node) {
    const std::string key = item.first.as<std::string>();
    const std::string name = prefix.empty() ? key : prefix + "." + key;
    const int line = item.first.Mark().line + 1;
    const auto first = seen.emplace(key, line);
    if (!first.second) {
      throw Error(
          "config: " + std::string(item.second.IsMap() ? "section '" : "'") +
          name + "' is written twice" + origin + ", on lines " +
          std::to_string(first.first->second) + " and " + std::to_string(line) +
          " (YAML would keep the last silently); " + "keep one");
    }
    if (item.second.IsMap()) {
      // Only sections are maps; a key that is a map is either unknown
      // (find_key throws) or misused (assign reports it).
      bool is_section = false;
      for (const auto& k : keys()) {
        if (k.name.compare(0, name.size() + 1, name + ".") == 0) {
          is_section = true;
        }
      }
      if (is_section) {
        apply_tree(cfg, item.second, name, origin);
        continue;
      }
      if (item.second.size() > 0) {
        // An unknown section: name its first key, so the message lists the
        // sections there are.
        find_key(
            name + "." + item.second.begin()->first.as<std::string>(), origin);
      }
    }
    if (prefix.empty() && !item.second.IsMap()) {
      throw Error(
          "config: top-level entry '" + name + "'" + origin +
          " must be a section (a mapping of keys)");
    }
    assign(cfg, find_key(name, origin), item.second, origin);
  }
}

std::string emit(const TrainConfig& cfg_in, bool with_help) {
  TrainConfig cfg = cfg_in;
  std::ostringstream out;
  std::string section, sub;
  for (const auto& k : keys()) {
    const std::string s = k.name.substr(0, k.name.find('.'));
    if (s != section) {
      section = s;
      sub.clear();
      out << s << ":\n";
    }
    // A third level (data.episodes.n_way): its keys sit together in the
    // table, under one "  episodes:" line.
    std::string rest = k.name.substr(s.size() + 1);
    const size_t dot = rest.find('.');
    const std::string ks = dot == std::string::npos ? "" : rest.substr(0, dot);
    if (ks != sub && !ks.empty())
      out << "  " << ks << ":\n";
    sub = ks;
    if (!ks.empty())
      rest = "  " + rest.substr(dot + 1);
    out << "  " << rest << ": " << value_text(k, cfg);
    if (with_help)
      out << "  # " << k.help;
    out << "\n";
  }
  return out.str();
}

}  // namespace

std::string TrainConfig::default_yaml() {
  return emit(TrainConfig{}, /*with_help=*/true);
}

std::string TrainConfig::to_yaml() const {
  return emit(*this, /*with_help=*/false);
}

std::string TrainConfig::describe_keys() {
  std::ostringstream out;
  TrainConfig defaults;
  for (const auto& k : keys()) {
    out << "  --" << k.name << "=VALUE\n      " << k.help << "\n      "
        << allowed(k) << "; default " << value_text(k, defaults) << "\n";
  }
  return out.str();
}

void TrainConfig::set(const std::string& assignment) {
  const auto eq = assignment.find('=');
  MT_CHECK(
      eq != std::string::npos && eq > 0,
      "config: override '",
      assignment,
      "' is not of the form section.key=value (e.g. --training.lr=0.1)");
  const std::string name = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  const Key& k = find_key(name, " (command line)");
  YAML::Node node;
  try {
    node = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error(
        "config: " + name + " = '" + text +
        "' (command line): not valid YAML: " + e.msg);
  }
  if (node.IsNull())
    node = YAML::Node(text);  // "--data.val=" means ""
  if ((k.type == Key::Type::kString || k.type == Key::Type::kBudget) &&
      node.IsScalar()) {
    node = YAML::Node(text);  // keep strings verbatim (no YAML typing)
  }
  assign(*this, k, node, " (command line)");
}

TrainConfig TrainConfig::load(
    const std::string& yaml_path, const std::vector<std::string>& overrides) {
  TrainConfig cfg;
  if (!yaml_path.empty()) {
    // stat first: opening a FIFO (or a device) would wait for a writer.
    struct stat st {};
    if (::stat(yaml_path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      throw Error(
          "config: '" + yaml_path + "' is " + file_kind(st.st_mode) +
          ", not a regular file; --config reads a YAML file (every rank "
          "reads it): write the configuration to a file");
    }
    std::ifstream in(yaml_path);
    MT_CHECK(
        in.good(),
        "config: cannot read '",
        yaml_path,
        "': no such file or not readable (pass an existing YAML file to "
        "--config, or leave --config out for the built-in defaults)");
    const std::string origin = " (in " + yaml_path + ")";
    YAML::Node root;
    try {
      root = YAML::LoadFile(yaml_path);
    } catch (const YAML::Exception& e) {
      throw Error(
          "config: '" + yaml_path + "' is not valid YAML: line " +
          std::to_string(e.mark.line + 1) + ": " + e.msg);
    }
    if (!root.IsNull()) {
      MT_CHECK(
          root.IsMap(),
          "config: '",
          yaml_path,
          "' must be a YAML mapping of sections (model:, data:, ...)");
      apply_tree(cfg, root, "", origin);
    }
  }
  for (const auto& o : overrides)
    cfg.set(o);
  cfg.validate();
  return cfg;
}

std::string TrainConfig::describe_markdown() {
  std::ostringstream out;
  out << "# Configuration keys\n\n"
         "Generated from `include/memtrain/config/keys.def` by `memtrain "
         "train\n--keys-markdown` (ctest `config_doc` fails when this file "
         "differs); edit\nthe rows there, not this page. A key is set in "
         "the YAML file given to\n`--config` (`section:` then `key: "
         "value`) or on the command line as\n`--section.key=value`; "
         "`memtrain train --print-config` prints the\nresolved "
         "configuration. How the keys work together, by kind of run:\n"
         "[config-guide.md](config-guide.md).\n";
  TrainConfig defaults;
  // Sections in the order they first appear; each once, with all its keys
  // (keys.def interleaves model.fsct with model, data.episodes with data).
  std::vector<std::string> sections;
  for (const Key& k : keys()) {
    const std::string s = k.name.substr(0, k.name.rfind('.'));
    if (std::find(sections.begin(), sections.end(), s) == sections.end())
      sections.push_back(s);
  }
  for (const std::string& section : sections) {
    out << "\n## " << section
        << "\n\n| key | default | allowed | what it "
           "does |\n| --- | --- | --- | --- |\n";
    for (const Key& k : keys()) {
      if (k.name.substr(0, k.name.rfind('.')) != section)
        continue;
      std::string help = k.help;
      for (size_t at = help.find('|'); at != std::string::npos;
           at = help.find('|', at + 2)) {
        help.replace(at, 1, "\\|");
      }
      out << "| `" << k.name << "` | `" << value_text(k, defaults) << "` | "
          << allowed(k) << " | " << help << " |\n";
    }
  }
  return out.str();
}

int64_t TrainConfig::effective_batch(int world) const {
  return training.effective_batch_size > 0
             ? training.effective_batch_size
             : world * training.gradient_accumulation_steps * data.batch_size;
}

}  // namespace memtrain
