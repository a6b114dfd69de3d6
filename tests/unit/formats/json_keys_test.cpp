// parse_json_keys_once: a key written twice in one object, at any depth,
// found with the path of its object; the same key in different objects is
// not a repeat.

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "memtrain/formats/text/json_keys.h"

namespace memtrain {
namespace {

std::optional<JsonKeyTwice> twice_in(const std::string& text) {
  std::optional<JsonKeyTwice> twice;
  parse_json_keys_once(text, &twice);
  return twice;
}

TEST(JsonKeys, EachKeyOnceIsParsedAsParseDoes) {
  const std::string text =
      R"({"a": {"x": 1, "y": [1, {"x": 2}]}, "b": [{"x": 1}, {"x": 2}],)"
      R"( "x": null, "": 3})";
  std::optional<JsonKeyTwice> twice;
  EXPECT_EQ(parse_json_keys_once(text, &twice), nlohmann::json::parse(text));
  EXPECT_FALSE(twice.has_value());
  EXPECT_FALSE(twice_in("[]").has_value());
  EXPECT_FALSE(twice_in("7").has_value());
}

TEST(JsonKeys, KeyTwiceIsFoundWithItsObjectsPath) {
  struct Case {
    const char* text;
    const char* key;
    const char* object;
  };
  const Case cases[] = {
      {R"({"labels": 1, "a": 2, "labels": 3})", "labels", "."},
      {R"({"labels": {"fg": 1, "fg": 2}})", "fg", ".labels"},
      {R"({"channel_names": {"0": "T1", "0": "CT"}})", "0", ".channel_names"},
      {R"({"training": [{"image": "a"}, {"image": "b", "image": "c"}]})",
       "image",
       ".training[1]"},
      {R"([[1, 2], [3, {"k": 1, "k": 1}]])", "k", "[1][1]"},
      {R"({"a b": {"": 1, "": 2}})", "", R"(."a b")"},
      {R"({"0x": {"d": {"e": 1, "e": 1}}})", "e", R"(."0x".d)"},
      // The first in the text's order.
      {R"({"a": {"b": 1, "b": 2}, "a": 3})", "b", ".a"},
  };
  for (const Case& c : cases) {
    const std::optional<JsonKeyTwice> twice = twice_in(c.text);
    ASSERT_TRUE(twice.has_value()) << c.text;
    EXPECT_EQ(twice->key, c.key) << c.text;
    EXPECT_EQ(twice->object, c.object) << c.text;
    EXPECT_EQ(twice->top_level(), std::string(c.object) == ".") << c.text;
  }
}

TEST(JsonKeys, BadJsonThrowsAsParseDoes) {
  std::optional<JsonKeyTwice> twice;
  EXPECT_THROW(
      parse_json_keys_once(R"({"a": 1,)", &twice), nlohmann::json::parse_error);
}

}  // namespace
}  // namespace memtrain
