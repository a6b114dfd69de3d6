#pragma once
// JSON read as nlohmann::json::parse reads it, with the one thing it (and
// Python's json) does silently refused by its callers: a key written twice
// in one object, of which the last value is kept. The safetensors header
// and convert-dataset's dataset.json and splits_final.json are read here.

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace memtrain {

// The first key, in the text's order, that an object holds twice.
struct JsonKeyTwice {
  std::string key;
  // The object's path, as jq writes it: "." (the top level), ".labels",
  // ".training[1]", ".\"a b\"".
  std::string object;
  bool top_level() const {
    return object == ".";
  }
};

// Parses `text` (throws nlohmann::json::exception as parse does); sets
// *twice to the first key written twice, if any (the value returned then
// holds its last value, as parse's).
nlohmann::json parse_json_keys_once(
    const std::string& text, std::optional<JsonKeyTwice>* twice);

}  // namespace memtrain
