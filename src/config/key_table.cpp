#include "key_table.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <type_traits>

#include "memtrain/config/memory_size.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

// The Key of one row of keys.def: its type from the field's.
template <class T>
Key make_key(
    const char* name, T* (*at)(TrainConfig&), Check check, const char* help) {
  Key k;
  k.name = name;
  k.help = help;
  k.check = check;
  if constexpr (std::is_same_v<T, int64_t>) {
    k.type = Key::Type::kInt;
    k.i = at;
  } else if constexpr (std::is_same_v<T, double>) {
    k.type = Key::Type::kFloat;
    k.f = at;
  } else if constexpr (std::is_same_v<T, bool>) {
    k.type = Key::Type::kBool;
    k.b = at;
  } else if constexpr (std::is_same_v<T, std::string>) {
    k.type = Key::Type::kString;
    k.s = at;
  } else if constexpr (std::is_same_v<T, Int3>) {
    k.type = Key::Type::kInt3;
    k.t = at;
  } else if constexpr (std::is_same_v<T, Range2>) {
    k.type = Key::Type::kFloat2;
    k.r = at;
  } else if constexpr (std::is_same_v<T, Strings>) {
    k.type = Key::Type::kStrings;
    k.l = at;
  } else if constexpr (std::is_same_v<T, ClassChoice>) {
    k.type = Key::Type::kClasses;
    k.c = at;
  } else if constexpr (std::is_same_v<T, BudgetSpec>) {
    // memory.budget: parsed into a BudgetSpec where it is read.
    k.type = Key::Type::kBudget;
    k.m = at;
  } else {
    // A choice: the value is parsed once, here, into the enum T; its
    // spellings (choices.h) are the allowed values, in `--help`'s order.
    static_assert(IsChoice<T>::value, "a key of a type keys.def lacks");
    k.type = Key::Type::kChoice;
    for (const char* spelling : choice_names(T{}))
      k.choices.emplace_back(spelling);
    k.get_choice = [at](TrainConfig& c) { return to_string(*at(c)); };
    k.set_choice = [at](TrainConfig& c, const std::string& text) {
      const std::optional<T> v = parse_choice<T>(text);
      if (v)
        *at(c) = *v;
      return v.has_value();
    };
  }
  return k;
}

}  // namespace

const std::vector<Key>& keys() {
  // clang-format off
  static const std::vector<Key> table = {
#define MEMTRAIN_KEY(section, field, type, def, check, help)          \
  make_key<type>(#section "." #field,                                  \
                 [](TrainConfig& c) { return &c.section.field; }, check, \
                 help),
#include "memtrain/config/keys.def"
  };
  // clang-format on
  return table;
}

namespace {

const char* type_name(const Key& k) {
  switch (k.type) {
    case Key::Type::kInt:
      return "an integer";
    case Key::Type::kFloat:
      return "a number";
    case Key::Type::kBool:
      return "true or false";
    case Key::Type::kString:
      return "a string";
    case Key::Type::kChoice:
      return "one of";
    case Key::Type::kInt3:
      return "an integer or a list [D, H, W] of integers";
    case Key::Type::kClasses:
      return "a list [c1, c2, ...] of class ids or a fraction in (0, 1)";
    case Key::Type::kStrings:
      return "a list [a, b, ...] of strings";
    case Key::Type::kFloat2:
      return "a list [lo, hi] of two numbers, lo <= hi,";
    case Key::Type::kBudget:
      return "a string";
  }
  return "";
}

}  // namespace

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    out += (i ? sep : "") + items[i];
  }
  return out;
}

std::string allowed(const Key& k) {
  std::ostringstream out;
  out << (k.check.or_auto ? "auto or an integer" : type_name(k));
  if (k.type == Key::Type::kChoice) {
    out << " " << join(k.choices, ", ");
  } else if (
      k.type == Key::Type::kInt || k.type == Key::Type::kFloat ||
      k.type == Key::Type::kInt3 || k.type == Key::Type::kFloat2) {
    const bool has_min = std::isfinite(k.check.min);
    const bool has_max = std::isfinite(k.check.max);
    auto num = [&](double v) {
      std::ostringstream n;
      if (k.type != Key::Type::kFloat && k.type != Key::Type::kFloat2) {
        n << static_cast<int64_t>(v);
      } else {
        n << v;
      }
      return n.str();
    };
    if (has_min && has_max) {
      out << " in " << (k.check.min_open ? "(" : "[") << num(k.check.min)
          << ", " << num(k.check.max) << (k.check.max_open ? ")" : "]");
    } else if (has_min) {
      out << (k.check.min_open ? " > " : " >= ") << num(k.check.min);
    }
  }
  return out.str();
}

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min(
          {row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

const Key& find_key(const std::string& name, const std::string& origin) {
  for (const auto& k : keys()) {
    if (k.name == name)
      return k;
  }
  std::string best;
  size_t best_d = 4;
  for (const auto& k : keys()) {
    const size_t d = edit_distance(name, k.name);
    if (d < best_d) {
      best_d = d;
      best = k.name;
    }
  }
  const std::string section = name.substr(0, name.find('.'));
  std::vector<std::string> same_section;
  for (const auto& k : keys()) {
    if (k.name.compare(0, section.size() + 1, section + ".") == 0) {
      same_section.push_back(k.name);
    }
  }
  std::ostringstream msg;
  msg << "config: unknown key '" << name << "'" << origin;
  if (!best.empty())
    msg << "; did you mean '" << best << "'?";
  if (!same_section.empty()) {
    msg << " Keys in '" << section << "': " << join(same_section, ", ");
  } else {
    std::vector<std::string> sections;
    for (const auto& k : keys()) {
      const std::string s = k.name.substr(0, k.name.find('.'));
      if (std::find(sections.begin(), sections.end(), s) == sections.end()) {
        sections.push_back(s);
      }
    }
    msg << " Sections: " << join(sections, ", ");
  }
  msg << " (`memtrain train --help` lists every key)";
  throw Error(msg.str());
}

namespace {

std::string scalar_text(const YAML::Node& node) {
  if (node.IsScalar())
    return node.Scalar();
  if (node.IsNull())
    return "";  // `key:` with nothing after it
  YAML::Emitter out;
  out << YAML::Flow << node;
  return out.c_str();
}

}  // namespace

void assign(
    TrainConfig& cfg,
    const Key& k,
    const YAML::Node& node,
    const std::string& origin) {
  const std::string text = scalar_text(node);
  auto fail = [&](const std::string& why) {
    throw Error(
        "config: " + k.name + " = '" + text + "'" + origin + ": " + why +
        "; allowed: " + allowed(k));
  };
  if (k.type == Key::Type::kInt3) {
    std::array<int64_t, 3> v{};
    const bool seq = node.IsSequence();
    if (!(node.IsScalar() || (seq && node.size() == 3)))
      fail("expected one integer or a list of three");
    for (size_t i = 0; i < 3; ++i) {
      try {
        v[i] = (seq ? node[i] : node).as<int64_t>();
      } catch (const YAML::Exception&) {
        fail("not an integer");
      }
      if (v[i] < k.check.min || v[i] > k.check.max)
        fail("out of range");
    }
    *k.t(cfg) = v;
    return;
  }
  if (k.type == Key::Type::kFloat2) {
    std::array<double, 2> v{};
    if (!(node.IsSequence() && node.size() == 2))
      fail("expected a list of two numbers");
    for (size_t i = 0; i < 2; ++i) {
      try {
        v[i] = node[i].as<double>();
      } catch (const YAML::Exception&) {
        fail("not a number");
      }
      if (!std::isfinite(v[i]) || v[i] < k.check.min ||
          (k.check.min_open && v[i] == k.check.min) || v[i] > k.check.max)
        fail("out of range");
    }
    if (v[0] > v[1])
      fail("lo is above hi");
    *k.r(cfg) = v;
    return;
  }
  if (k.type == Key::Type::kClasses) {
    ClassChoice v;
    v.fraction = 0;
    try {
      if (node.IsSequence()) {
        for (const auto& item : node)
          v.ids.push_back(item.as<int64_t>());
      } else {
        v.fraction = node.as<double>();
      }
    } catch (const YAML::Exception&) {
      fail("not a list of integers or a number");
    }
    for (int64_t id : v.ids) {
      if (id < 0)
        fail("class ids are never negative");
    }
    if (node.IsSequence() && v.ids.empty())
      fail("an empty list");
    if (!node.IsSequence() && !(v.fraction > 0 && v.fraction < 1))
      fail("out of range");
    *k.c(cfg) = v;
    return;
  }
  if (k.type == Key::Type::kStrings) {
    std::vector<std::string> v;
    if (node.IsSequence()) {
      for (const auto& item : node) {
        if (!item.IsScalar() || item.Scalar().empty())
          fail("expected a list of non-empty strings");
        v.push_back(item.Scalar());
      }
    } else if (node.IsScalar() && !node.Scalar().empty()) {
      v.push_back(node.Scalar());
    } else if (!node.IsNull() && !node.IsScalar()) {
      fail("expected a list of strings");
    }
    *k.l(cfg) = v;
    return;
  }
  const bool string_like =
      k.type == Key::Type::kString || k.type == Key::Type::kBudget;
  if (node.IsNull() && string_like && !k.check.may_be_empty)
    fail("empty; this key needs a value");  // `budget:` with nothing after
  if (!node.IsScalar())
    fail("expected a single value");
  switch (k.type) {
    case Key::Type::kInt: {
      int64_t v = 0;
      if (k.check.or_auto && node.Scalar() == "auto") {
        *k.i(cfg) = k.check.auto_is;
        break;
      }
      try {
        v = node.as<int64_t>();
      } catch (const YAML::Exception&) {
        fail("not an integer");
      }
      if (v < k.check.min || v > k.check.max)
        fail("out of range");
      *k.i(cfg) = v;
      break;
    }
    case Key::Type::kFloat: {
      double v = 0;
      try {
        v = node.as<double>();
      } catch (const YAML::Exception&) {
        fail("not a number");
      }
      if (!std::isfinite(v) || v < k.check.min ||
          (k.check.min_open && v == k.check.min) || v > k.check.max ||
          (k.check.max_open && v == k.check.max)) {
        fail("out of range");
      }
      *k.f(cfg) = v;
      break;
    }
    case Key::Type::kBool: {
      bool v = false;
      try {
        v = node.as<bool>();
      } catch (const YAML::Exception&) {
        fail("not a boolean");
      }
      *k.b(cfg) = v;
      break;
    }
    case Key::Type::kString:
      if (node.Scalar().empty() && !k.check.may_be_empty)
        fail("empty; this key needs a value");
      *k.s(cfg) = node.Scalar();
      break;
    case Key::Type::kChoice:
      if (!k.set_choice(cfg, node.Scalar()))
        fail("not a valid choice");
      break;
    case Key::Type::kBudget:
      if (node.Scalar().empty())
        fail("empty; this key needs a value");
      *k.m(cfg) = BudgetSpec(node.Scalar());  // throws with the profiles
      break;
    case Key::Type::kInt3:
    case Key::Type::kClasses:
    case Key::Type::kStrings:
    case Key::Type::kFloat2:
      break;  // handled above
  }
}

namespace {

// The shortest decimal text that reads back as `v` (4/3: 1.3333333333333333).
std::string shortest(double v) {
  for (int digits = 6; digits <= 17; ++digits) {
    std::ostringstream out;
    out.precision(digits);
    out << v;
    if (std::strtod(out.str().c_str(), nullptr) == v)
      return out.str();
  }
  return std::to_string(v);
}

}  // namespace

std::string value_text(const Key& k, TrainConfig& cfg) {
  std::ostringstream out;
  switch (k.type) {
    case Key::Type::kInt:
      if (k.check.or_auto && *k.i(cfg) == k.check.auto_is) {
        out << "auto";
      } else {
        out << *k.i(cfg);
      }
      break;
    case Key::Type::kFloat:
      out << *k.f(cfg);
      break;
    case Key::Type::kBool:
      out << (*k.b(cfg) ? "true" : "false");
      break;
    case Key::Type::kInt3: {
      const auto& v = *k.t(cfg);
      out << "[" << v[0] << ", " << v[1] << ", " << v[2] << "]";
      break;
    }
    case Key::Type::kClasses: {
      const ClassChoice& v = *k.c(cfg);
      if (v.ids.empty()) {
        out << v.fraction;
        break;
      }
      out << "[";
      for (size_t i = 0; i < v.ids.size(); ++i)
        out << (i ? ", " : "") << v.ids[i];
      out << "]";
      break;
    }
    case Key::Type::kStrings: {
      YAML::Emitter e;
      e << YAML::Flow << *k.l(cfg);
      out << e.c_str();
      break;
    }
    case Key::Type::kFloat2: {
      const auto& v = *k.r(cfg);
      out << "[" << shortest(v[0]) << ", " << shortest(v[1]) << "]";
      break;
    }
    case Key::Type::kString: {
      YAML::Emitter e;
      e << YAML::DoubleQuoted << *k.s(cfg);
      out << e.c_str();
      break;
    }
    case Key::Type::kChoice: {
      YAML::Emitter e;
      e << YAML::DoubleQuoted << k.get_choice(cfg);
      out << e.c_str();
      break;
    }
    case Key::Type::kBudget: {
      YAML::Emitter e;
      e << YAML::DoubleQuoted << k.m(cfg)->text();
      out << e.c_str();
      break;
    }
  }
  return out.str();
}

}  // namespace memtrain
