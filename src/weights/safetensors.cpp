#include "memtrain/weights/safetensors.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>

#include "memtrain/formats/text/json_keys.h"
#include "memtrain/util/atomic_file.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

struct DtypeName {
  at::ScalarType type;
  const char* name;
};

constexpr DtypeName kDtypes[] = {
    {at::kFloat, "F32"},
    {at::kDouble, "F64"},
    {at::kHalf, "F16"},
    {at::kBFloat16, "BF16"},
    {at::kLong, "I64"},
    {at::kInt, "I32"},
    {at::kByte, "U8"},
    {at::kChar, "I8"},
    {at::kShort, "I16"},
    {at::kBool, "BOOL"},
};

const char* dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes) {
    if (d.type == t)
      return d.name;
  }
  throw Error(
      std::string("safetensors: unsupported dtype ") + c10::toString(t));
}

bool dtype_from_name(const std::string& name, at::ScalarType* out) {
  for (const auto& d : kDtypes) {
    if (name == d.name) {
      *out = d.type;
      return true;
    }
  }
  return false;
}

}  // namespace

void save_safetensors(
    const std::string& path,
    const NamedTensors& tensors,
    const std::map<std::string, std::string>& metadata) {
  std::vector<at::Tensor> host;
  nlohmann::ordered_json header;
  if (!metadata.empty())
    header["__metadata__"] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    MT_CHECK(
        seen.insert(name).second,
        "safetensors: tensor name '",
        name,
        "' appears twice");
    at::Tensor h = t.detach().to(torch::kCPU).contiguous();
    const uint64_t bytes = static_cast<uint64_t>(h.numel()) * h.element_size();
    header[name] = {
        {"dtype", dtype_name(h.scalar_type())},
        {"shape", h.sizes().vec()},
        {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    host.push_back(std::move(h));
  }
  std::string text = header.dump();
  // Pad with spaces so that the data starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  uint64_t n = text.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<unsigned char>(n >> (8 * i));
  write_file_atomically(path, [&](const auto& sink) {
    sink(len, 8);
    sink(text.data(), text.size());
    for (const auto& h : host) {
      sink(h.data_ptr(), static_cast<size_t>(h.numel()) * h.element_size());
    }
  });
}

NamedTensors load_safetensors(
    const std::string& path, std::map<std::string, std::string>* metadata) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), "safetensors: cannot open '", path, "'");
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  unsigned char len[8];
  MT_CHECK(
      file_size >= 8 && in.read(reinterpret_cast<char*>(len), 8),
      "safetensors: '",
      path,
      "' is too short to hold a header");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | len[i];
  MT_CHECK(
      n <= file_size - 8 && n < (100u << 20),
      "safetensors: '",
      path,
      "' has a header length (",
      n,
      ") beyond the file's size");
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  nlohmann::json header;
  // A name (or an entry's field) given twice would keep its last entry
  // silently (the safetensors library refuses it).
  std::optional<JsonKeyTwice> twice;
  try {
    header = parse_json_keys_once(text, &twice);
  } catch (const nlohmann::json::exception& e) {
    throw Error("safetensors: '" + path + "' header is not JSON: " + e.what());
  }
  if (twice && twice->top_level())
    throw Error(
        "safetensors: '" + path + "' names tensor '" + twice->key +
        "' twice in its header; the file is damaged");
  if (twice)
    throw Error(
        "safetensors: '" + path + "' header: " + twice->object + " has key '" +
        twice->key + "' twice; the file is damaged");
  const uint64_t data_start = 8 + n;
  const uint64_t data_size = file_size - data_start;
  struct Entry {
    std::string name;
    at::ScalarType type;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (metadata) {
        for (auto m = it->begin(); m != it->end(); ++m) {
          (*metadata)[m.key()] = m->get<std::string>();
        }
      }
      continue;
    }
    Entry e;
    e.name = it.key();
    try {
      MT_CHECK(
          dtype_from_name(it->at("dtype").get<std::string>(), &e.type),
          "safetensors: '",
          path,
          "' tensor '",
          e.name,
          "' has an unsupported dtype");
      e.shape = it->at("shape").get<std::vector<int64_t>>();
      const auto off = it->at("data_offsets").get<std::vector<uint64_t>>();
      MT_CHECK(off.size() == 2, "bad data_offsets");
      e.begin = off[0];
      e.end = off[1];
    } catch (const nlohmann::json::exception& ex) {
      throw Error(
          "safetensors: '" + path + "' tensor '" + e.name +
          "' has a malformed entry: " + ex.what());
    }
    int64_t numel = 1;
    for (int64_t d : e.shape)
      numel *= d;
    MT_CHECK(
        e.begin <= e.end && e.end <= data_size &&
            e.end - e.begin ==
                static_cast<uint64_t>(numel) * c10::elementSize(e.type),
        "safetensors: '",
        path,
        "' tensor '",
        e.name,
        "' has offsets that do not match its shape or the file size "
        "(truncated file?)");
    entries.push_back(std::move(e));
  }
  // By offset; an empty tensor before a full one at the same offset, so
  // that both tile.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
  });
  // The tensors tile the data, in order, without overlap or hole (the
  // safetensors format's rule): two tensors sharing bytes would load as
  // each other's values.
  uint64_t at = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    MT_CHECK(
        e.begin >= at,
        "safetensors: '",
        path,
        "' tensors '",
        i > 0 ? entries[i - 1].name : std::string(),
        "' and '",
        e.name,
        "' overlap (bytes ",
        e.begin,
        "-",
        e.end,
        " of the data start before ",
        at,
        "); the file is damaged");
    MT_CHECK(
        e.begin == at,
        "safetensors: '",
        path,
        "' leaves bytes ",
        at,
        "-",
        e.begin,
        " of its data to no tensor (before '",
        e.name,
        "'); the file is damaged");
    at = e.end;
  }
  MT_CHECK(
      at == data_size,
      "safetensors: '",
      path,
      "' holds ",
      data_size - at,
      " bytes after its last tensor's data; the file is damaged");
  NamedTensors out;
  for (const auto& e : entries) {
    at::Tensor t = torch::empty(e.shape, torch::TensorOptions(e.type));
    in.seekg(static_cast<std::streamoff>(data_start + e.begin));
    in.read(
        static_cast<char*>(t.data_ptr()),
        static_cast<std::streamsize>(e.end - e.begin));
    MT_CHECK(
        in.good(),
        "safetensors: '",
        path,
        "': cannot read tensor '",
        e.name,
        "'");
    out.emplace_back(e.name, std::move(t));
  }
  return out;
}

}  // namespace memtrain
