#include "memtrain/formats/text/json_keys.h"

#include <cctype>
#include <cstdint>
#include <set>
#include <vector>

namespace memtrain {
namespace {

// One open object or array while parsing.
struct Level {
  bool object = true;
  std::set<std::string> keys;  // an object's keys so far
  std::string key;             // an object's current key
  int64_t index = -1;          // an array's current element
};

bool plain_name(const std::string& k) {
  if (k.empty() || std::isdigit(static_cast<unsigned char>(k[0])))
    return false;
  for (const unsigned char c : k) {
    if (!std::isalnum(c) && c != '_')
      return false;
  }
  return true;
}

// jq's path of the innermost open value.
std::string path_of(const std::vector<Level>& levels) {
  std::string p;
  // Each level but the last names its current child: the next level.
  for (size_t i = 0; i + 1 < levels.size(); ++i) {
    const Level& l = levels[i];
    if (!l.object)
      p += "[" + std::to_string(l.index) + "]";
    else if (plain_name(l.key))
      p += "." + l.key;
    else
      p += "." + nlohmann::json(l.key).dump();
  }
  return p.empty() ? "." : p;
}

}  // namespace

nlohmann::json parse_json_keys_once(
    const std::string& text, std::optional<JsonKeyTwice>* twice) {
  using Event = nlohmann::json::parse_event_t;
  twice->reset();
  std::vector<Level> levels;
  // An element of an array starts: its index.
  auto element = [&] {
    if (!levels.empty() && !levels.back().object)
      ++levels.back().index;
  };
  return nlohmann::json::parse(
      text, [&](int, Event event, nlohmann::json& parsed) {
        switch (event) {
          case Event::object_start:
          case Event::array_start:
            element();
            levels.push_back(Level{event == Event::object_start, {}, {}, -1});
            break;
          case Event::key: {
            Level& l = levels.back();
            l.key = parsed.get<std::string>();
            if (!l.keys.insert(l.key).second && !*twice)
              *twice = JsonKeyTwice{l.key, path_of(levels)};
            break;
          }
          case Event::value:  // a number, string, bool or null
            element();
            break;
          case Event::object_end:
          case Event::array_end:
            levels.pop_back();
            break;
        }
        return true;
      });
}

}  // namespace memtrain
