#pragma once
// How weights/ writes names and shapes in its messages (private to
// src/weights/).

#include <cstdint>
#include <string>
#include <vector>

namespace memtrain {

// "[2048, 1000]"
inline std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i)
    out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// "a, b, c, ... (12 more)": the first `few` items.
inline std::string first_few(
    const std::vector<std::string>& items, size_t few = 6) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < few; ++i)
    out += (i ? ", " : "") + items[i];
  if (items.size() > few)
    out += ", ... (" + std::to_string(items.size() - few) + " more)";
  return out;
}

inline bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() &&
         s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace memtrain
