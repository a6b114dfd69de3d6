#pragma once
// The CUDA caching allocator's settings in force: memory.allocator_conf
// merged with what the user exported (PYTORCH_ALLOC_CONF, or its older name
// PYTORCH_CUDA_ALLOC_CONF), the environment winning key by key. LibTorch
// parses its settings string as a whole, so applying memory.allocator_conf
// alone would drop the user's max_split_size_mb or
// garbage_collection_threshold; the merged string is what is applied, and
// environment.json says where each key came from. No LibTorch here.

#include <string>
#include <utility>
#include <vector>

namespace memtrain::memory {

struct AllocatorSetting {
  std::string key;
  std::string value;  // as written: "True", "512", "[256:1,512:2]"
  std::string from;   // "memory.allocator_conf" or the variable's name
};

struct AllocatorSettings {
  std::vector<AllocatorSetting> entries;  // first appearance order

  // PYTORCH_CUDA_ALLOC_CONF syntax: "key:value,key:value".
  std::string text() const;
  // The entry for `key`, or nullptr.
  const AllocatorSetting* find(const std::string& key) const;
};

// Splits "key:value,key:value" (a value may be a bracketed list holding
// commas and colons, as roundup_power2_divisions's) into entries tagged
// `from`. Throws memtrain::Error naming `from`, the text and the fault for
// an entry without a key or value, an unbalanced bracket, or a key given
// twice.
AllocatorSettings parse_allocator_conf(
    const std::string& text, const std::string& from);

// memory.allocator_conf's entries, each replaced by the environment's
// value for the same key, then the environment's other keys. `env_name`
// names the variable `env_text` came from ("" when none is set).
// Refuses (memtrain::Error) expandable_segments:True together with
// max_split_size_mb, wherever each came from: the caching allocator does
// not split blocks of expandable segments by that limit and the pair is
// known to fail (PyTorch issue 123548).
AllocatorSettings merge_allocator_conf(
    const std::string& config_text,
    const std::string& env_text,
    const std::string& env_name);

// What the process exported: PYTORCH_ALLOC_CONF when set (LibTorch >= 2.9
// reads it first), else PYTORCH_CUDA_ALLOC_CONF; {name, text} or {"", ""}.
std::pair<std::string, std::string> allocator_conf_from_environment();

}  // namespace memtrain::memory
