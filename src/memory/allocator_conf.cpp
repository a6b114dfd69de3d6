#include "memtrain/memory/allocator_conf.h"

#include <cstdlib>

#include "memtrain/util/error.h"

namespace memtrain::memory {
namespace {

bool is_true(const std::string& v) {
  return v == "True" || v == "true" || v == "1";
}

}  // namespace

std::string AllocatorSettings::text() const {
  std::string out;
  for (const auto& e : entries)
    out += (out.empty() ? "" : ",") + e.key + ":" + e.value;
  return out;
}

const AllocatorSetting* AllocatorSettings::find(const std::string& key) const {
  for (const auto& e : entries) {
    if (e.key == key)
      return &e;
  }
  return nullptr;
}

AllocatorSettings parse_allocator_conf(
    const std::string& text, const std::string& from) {
  AllocatorSettings out;
  // Top-level commas separate entries; those inside [...] belong to a value.
  std::vector<std::string> items;
  std::string cur;
  int depth = 0;
  for (char c : text) {
    if (c == '[') {
      ++depth;
    } else if (c == ']') {
      MT_CHECK(
          --depth >= 0,
          from,
          "='",
          text,
          "': a ']' without its '['; write key:value pairs separated by "
          "commas, lists as key:[a:b,c:d]");
    }
    if (c == ',' && depth == 0) {
      items.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  MT_CHECK(
      depth == 0,
      from,
      "='",
      text,
      "': a '[' without its ']'; write lists as key:[a:b,c:d]");
  items.push_back(cur);
  for (const auto& raw : items) {
    const std::string item = trim(raw);
    if (item.empty())
      continue;  // "a:1,,b:2" and a trailing comma, as LibTorch accepts
    const size_t colon = item.find(':');
    const std::string key =
        colon == std::string::npos ? item : trim(item.substr(0, colon));
    const std::string value =
        colon == std::string::npos ? "" : trim(item.substr(colon + 1));
    MT_CHECK(
        !key.empty() && !value.empty(),
        from,
        "='",
        text,
        "': '",
        item,
        "' is not key:value (for example expandable_segments:True or "
        "max_split_size_mb:512)");
    MT_CHECK(
        out.find(key) == nullptr,
        from,
        "='",
        text,
        "': ",
        key,
        " is given twice; keep one");
    out.entries.push_back({key, value, from});
  }
  return out;
}

AllocatorSettings merge_allocator_conf(
    const std::string& config_text,
    const std::string& env_text,
    const std::string& env_name) {
  AllocatorSettings merged =
      parse_allocator_conf(config_text, "memory.allocator_conf");
  const AllocatorSettings env = parse_allocator_conf(
      env_text, env_name.empty() ? "the environment" : env_name);
  for (const auto& e : env.entries) {
    bool replaced = false;
    for (auto& m : merged.entries) {
      if (m.key == e.key) {
        m = e;
        replaced = true;
      }
    }
    if (!replaced)
      merged.entries.push_back(e);
  }
  const AllocatorSetting* expandable = merged.find("expandable_segments");
  const AllocatorSetting* split = merged.find("max_split_size_mb");
  MT_CHECK(
      !(expandable && is_true(expandable->value) && split),
      "the CUDA allocator settings combine expandable_segments:",
      expandable ? expandable->value : "",
      " (from ",
      expandable ? expandable->from : "",
      ") with max_split_size_mb:",
      split ? split->value : "",
      " (from ",
      split ? split->from : "",
      "): the caching allocator does not split expandable segments by that "
      "limit, and the pair is known to fail (PyTorch issue 123548). Keep "
      "one: drop max_split_size_mb, or set "
      "--memory.allocator_conf=expandable_segments:False");
  return merged;
}

std::pair<std::string, std::string> allocator_conf_from_environment() {
  for (const char* name : {"PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"}) {
    if (const char* v = std::getenv(name))
      return {name, v};
  }
  return {"", ""};
}

}  // namespace memtrain::memory
