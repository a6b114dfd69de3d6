#include "memtrain/train/run_files/checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "memtrain/util/error.h"
#include "memtrain/util/fnv.h"

namespace memtrain {

// Note [Checkpoint format]
// A safetensors file: "model/<name>" holds each parameter and buffer
// (batch-norm statistics; weights/model_state.h), "optimizer" the
// bytes of LibTorch's own optimizer archive (Optimizer::save, exact for SGD
// momentum and AdamW moments), "rng/<rank>" each rank's CPU generator state,
// "rng_device/<rank>" each rank's CUDA generator state (CUDA runs).
// The metadata holds the position (step, epoch, samples of the epoch done),
// the world size, effective batch, model name, loss-scaler state, the
// resolved config, the best validation metric so far, and "checksum":
// FNV-1a 64 over everything else in the file — every metadata key and value
// (in key order), every tensor's name, dtype, shape and bytes (in file order)
// — verified on load, so a truncated, corrupted or edited file (an edited
// `step` would resume at the wrong place) is refused rather than half-loaded.
// (Format 1, before 2026-11-22, summed the tensors only; such files still
// load, with that said in the resume line.) The position is in samples, not
// windows, so a run can resume at another world size as long as the
// effective batch (the window) is the same.

namespace {

constexpr const char* kFormat = "memtrain-checkpoint-2";
constexpr const char* kFormat1 = "memtrain-checkpoint-1";  // tensors only

uint64_t fnv_string(uint64_t h, const std::string& s) {
  h = fnv1a(h, s.data(), s.size());
  return fnv1a(h, "", 1);  // a terminator: "ab"+"c" differs from "a"+"bc"
}

// Over the metadata (all but "checksum" itself) when `meta` is given, then
// every tensor's name, dtype, shape and bytes.
std::string checksum(
    const NamedTensors& tensors,
    const std::map<std::string, std::string>* meta) {
  uint64_t h = kFnvOffset;
  if (meta) {
    for (const auto& [key, value] : *meta) {  // std::map: key order
      if (key == "checksum")
        continue;
      h = fnv_string(fnv_string(h, key), value);
    }
  }
  for (const auto& [name, t] : tensors) {
    const at::Tensor c = t.contiguous();
    h = meta ? fnv_string(h, name) : fnv1a(h, name.data(), name.size());
    if (meta) {
      h = fnv_string(h, c10::toString(c.scalar_type()));
      for (const int64_t d : c.sizes())
        h = fnv1a(h, &d, sizeof d);
    }
    h = fnv1a(
        h, c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
  }
  char buf[17];
  std::snprintf(
      buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

NamedTensors file_tensors(const Checkpoint& c) {
  NamedTensors out;
  for (const auto& [name, t] : c.params)
    out.emplace_back("model/" + name, t);
  at::Tensor opt =
      torch::empty({static_cast<int64_t>(c.optimizer.size())}, torch::kUInt8);
  std::memcpy(opt.data_ptr(), c.optimizer.data(), c.optimizer.size());
  out.emplace_back("optimizer", opt);
  for (size_t r = 0; r < c.rng_device.size(); ++r) {
    out.emplace_back("rng_device/" + std::to_string(r), c.rng_device[r]);
  }
  for (size_t r = 0; r < c.rng.size(); ++r) {
    out.emplace_back("rng/" + std::to_string(r), c.rng[r]);
  }
  return out;
}

int64_t step_of(const std::string& file) {
  // ckpt-00000042.safetensors
  const auto dash = file.rfind("ckpt-");
  if (dash == std::string::npos)
    return -1;
  return std::atoll(file.c_str() + dash + 5);
}

}  // namespace

std::string checkpoint_path(const std::string& output_dir, int64_t step) {
  char name[64];
  std::snprintf(
      name, sizeof(name), "ckpt-%08ld.safetensors", static_cast<long>(step));
  return output_dir + "/checkpoints/" + name;
}

void save_checkpoint(const std::string& path, const Checkpoint& c) {
  const NamedTensors tensors = file_tensors(c);
  const CheckpointState& s = c.state;
  auto exact = [](double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    return std::string(buf);
  };
  std::map<std::string, std::string> meta = {
      {"format", kFormat},
      {"step", std::to_string(s.step)},
      {"epoch", std::to_string(s.epoch)},
      {"epoch_samples", std::to_string(s.epoch_samples)},
      {"epoch_loss_sum", exact(s.epoch_loss_sum)},
      {"world_size", std::to_string(s.world_size)},
      {"effective_batch", std::to_string(s.effective_batch)},
      {"model", s.model},
      {"loss_scale", exact(s.loss_scale)},
      {"scaler_good_steps", std::to_string(s.scaler_good_steps)},
      {"scaler_skipped", std::to_string(s.scaler_skipped)},
      {"nonfinite_in_a_row", std::to_string(s.nonfinite_in_a_row)},
      {"config", s.config_yaml},
      {"best_metric", s.best_metric},
      {"best_value", exact(s.best_value)},
      {"best_step", std::to_string(s.best_step)}};
  meta["checksum"] = checksum(tensors, &meta);
  save_safetensors(path, tensors, meta);
}

Checkpoint load_checkpoint(const std::string& path) {
  std::map<std::string, std::string> meta;
  NamedTensors tensors;
  try {
    tensors = load_safetensors(path, &meta);
  } catch (const Error& e) {
    throw Error("checkpoint '" + path + "' cannot be read: " + e.what());
  }
  const bool format1 = meta["format"] == kFormat1;
  MT_CHECK(
      meta["format"] == kFormat || format1,
      "checkpoint '",
      path,
      "' is not a memtrain checkpoint (format '",
      meta["format"],
      "', expected '",
      kFormat,
      "')");
  MT_CHECK(
      checksum(tensors, format1 ? nullptr : &meta) == meta["checksum"],
      "checkpoint '",
      path,
      "' is corrupt or was edited: its checksum (over its position, "
      "world size, scaler state, config and every tensor) does not match "
      "its contents; resume from another checkpoint (--resume FILE) or "
      "start anew");
  Checkpoint c;
  c.path = path;
  c.metadata_checked = !format1;
  CheckpointState& s = c.state;
  auto num = [&](const char* key) {
    MT_CHECK(meta.count(key), "checkpoint '", path, "' lacks '", key, "'");
    return std::atoll(meta[key].c_str());
  };
  s.step = num("step");
  s.epoch = num("epoch");
  s.epoch_samples = num("epoch_samples");
  s.world_size = num("world_size");
  s.effective_batch = num("effective_batch");
  s.scaler_good_steps = num("scaler_good_steps");
  s.scaler_skipped = num("scaler_skipped");
  s.nonfinite_in_a_row = std::atoll(meta["nonfinite_in_a_row"].c_str());
  s.loss_scale = std::atof(meta["loss_scale"].c_str());
  s.epoch_loss_sum = std::strtod(meta["epoch_loss_sum"].c_str(), nullptr);
  s.model = meta["model"];
  s.config_yaml = meta["config"];
  s.best_metric = meta["best_metric"];
  if (meta.count("best_value"))
    s.best_value = std::strtod(meta["best_value"].c_str(), nullptr);
  if (meta.count("best_step"))
    s.best_step = std::atoll(meta["best_step"].c_str());
  for (auto& [name, t] : tensors) {
    if (name.rfind("model/", 0) == 0) {
      c.params.emplace_back(name.substr(6), t);
    } else if (name == "optimizer") {
      c.optimizer.assign(
          static_cast<const char*>(t.data_ptr()),
          static_cast<size_t>(t.numel()));
    } else if (name.rfind("rng/", 0) == 0) {
      const size_t r = std::stoul(name.substr(4));
      if (c.rng.size() <= r)
        c.rng.resize(r + 1);
      c.rng[r] = t;
    } else if (name.rfind("rng_device/", 0) == 0) {
      const size_t r = std::stoul(name.substr(11));
      if (c.rng_device.size() <= r)
        c.rng_device.resize(r + 1);
      c.rng_device[r] = t;
    }
  }
  MT_CHECK(
      !c.params.empty() && !c.optimizer.empty(),
      "checkpoint '",
      path,
      "' has no model or optimizer state");
  return c;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  for (const std::string& d : {dir + "/checkpoints", dir}) {
    DIR* h = opendir(d.c_str());
    if (!h)
      continue;
    while (dirent* e = readdir(h)) {
      const std::string name = e->d_name;
      if (name.rfind("ckpt-", 0) == 0 && name.size() > 12 &&
          name.compare(name.size() - 12, 12, ".safetensors") == 0) {
        found.emplace_back(step_of(name), d + "/" + name);
      }
    }
    closedir(h);
    if (!found.empty())
      break;
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> out;
  for (auto& f : found)
    out.push_back(f.second);
  return out;
}

void prune_checkpoints(
    const std::string& output_dir, int64_t keep, int64_t current_step) {
  int64_t kept = 0;
  for (const auto& path : list_checkpoints(output_dir)) {  // newest first
    if (step_of(path) > current_step || ++kept > keep)
      std::remove(path.c_str());
  }
}

}  // namespace memtrain
