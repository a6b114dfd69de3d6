#include "train/run_files/run_checkpoint.h"

#include <torch/torch.h>

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <sstream>

#include "memtrain/memory/device_memory.h"
#include "memtrain/train/run_files/checkpoint.h"
#include "memtrain/util/atomic_file.h"
#include "memtrain/util/clock.h"
#include "memtrain/util/error.h"
#include "memtrain/util/rank_log.h"
#include "memtrain/weights/model_state.h"
#include "train/records/records.h"

namespace memtrain {

namespace {

// The first validation key that decides what a validation metric means and
// differs between the checkpoint's resolved config `saved` and `cfg` ("" if
// none): absent from an older checkpoint counts as different.
std::string validation_changed(
    const std::string& saved, const TrainConfig& cfg) {
  YAML::Node then, now;
  try {
    then = YAML::Load(saved)["validation"];
    now = YAML::Load(cfg.to_yaml())["validation"];
  } catch (const YAML::Exception&) {
    return "*";
  }
  for (const char* key :
       {"roi",
        "overlap",
        "blend",
        "sigma_scale",
        "padding",
        "include_background",
        "ignore_empty",
        "episodes"}) {
    if (!then || !then[key] || YAML::Dump(then[key]) != YAML::Dump(now[key]))
      return key;
  }
  return "";
}

// Every rank's `row` (a host tensor of bytes, the same length on every
// rank), as a [world, length] int32 table on every rank.
at::Tensor gather_rows(Communicator& comm, const at::Tensor& row) {
  return comm.all_gather_rows(
      row.to(torch::kInt32).unsqueeze(0), comm.rank(), comm.size());
}

}  // namespace

nlohmann::json save_run_checkpoint(
    RunState& m,
    const RunCounters& counters,
    bool writer,
    int64_t step,
    int64_t epoch,
    int64_t samples_done,
    double loss_sum) {
  const auto start = std::chrono::steady_clock::now();
  broadcast_buffers(m.comm, m.buffers);  // rank 0's statistics, everywhere
  memory::HostScope host;                // checkpoint buffers are host memory
  // Every rank's RNG states travel to rank 0 (a [world, state] table).
  const RngState mine = m.placement.rng_state();
  const at::Tensor cpu = gather_rows(m.comm, mine.cpu);
  const at::Tensor device =
      mine.device.defined() ? gather_rows(m.comm, mine.device) : at::Tensor();
  if (!writer)
    return nullptr;
  Checkpoint c;
  CheckpointState& st = c.state;
  st.step = step;
  st.epoch = epoch;
  st.epoch_samples = samples_done;
  st.epoch_loss_sum = loss_sum;
  st.world_size = m.comm.size();
  st.effective_batch = m.shape.effective_batch;
  st.model = to_string(m.cfg.model.name);
  st.config_yaml = m.cfg.to_yaml();
  st.loss_scale = m.scaler->scale();
  st.scaler_good_steps = m.scaler->good_steps();
  st.scaler_skipped = m.scaler->enabled() ? m.scaler->skipped_steps()
                                          : counters.nonfinite_skips;
  st.nonfinite_in_a_row = counters.nonfinite_in_a_row;
  st.best_metric = best_metric(m);
  st.best_value = counters.best_value;
  st.best_step = counters.best_step;
  for (const auto& [name, t] : state_tensors(*m.model))
    c.params.emplace_back(name, m.placement.to_host(t.detach()));
  torch::serialize::OutputArchive archive;
  m.optimizer->save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  c.optimizer = bytes.str();
  for (int r = 0; r < m.comm.size(); ++r) {
    c.rng.push_back(cpu[r].to(torch::kUInt8));
    if (device.defined())
      c.rng_device.push_back(device[r].to(torch::kUInt8));
  }
  make_directories(m.cfg.output.dir + "/checkpoints");
  const std::string path = checkpoint_path(m.cfg.output.dir, step);
  save_checkpoint(path, c);
  prune_checkpoints(m.cfg.output.dir, m.cfg.training.keep_checkpoints, step);
  log_event("checkpoint written: " + path);
  return checkpoint_record(step, epoch, path, seconds_since(start));
}

ResumePoint resume_run(
    RunState& m,
    RunCounters& counters,
    const std::string& spec,
    std::string& what) {
  std::vector<std::string> candidates;
  const bool automatic = spec == "auto";
  struct stat st {};
  const bool folder =
      automatic || (::stat(spec.c_str(), &st) == 0 && S_ISDIR(st.st_mode));
  if (folder) {
    const std::string dir = automatic ? m.cfg.output.dir : spec;
    candidates = list_checkpoints(dir);
    if (candidates.empty()) {
      MT_CHECK(
          automatic,
          "--resume ",
          spec,
          ": no checkpoint (ckpt-*.safetensors) in that folder");
      what = "--resume auto: no checkpoint in " + dir +
             "/checkpoints; starting from the beginning";
      return {};
    }
  } else {
    MT_CHECK(
        ::stat(spec.c_str(), &st) == 0,
        "--resume ",
        spec,
        ": no such file or folder (give a checkpoint file, a folder "
        "holding checkpoints, or auto)");
    candidates = {spec};
  }
  std::optional<Checkpoint> ck;
  std::string skipped;
  for (const auto& path : candidates) {
    try {
      ck = load_checkpoint(path);
      break;
    } catch (const Error& e) {
      if (!folder)
        throw;
      skipped += std::string(skipped.empty() ? "" : "; ") + e.what();
    }
  }
  MT_CHECK(
      ck.has_value(), "--resume ", spec, ": no valid checkpoint: ", skipped);
  const CheckpointState& s = ck->state;
  const std::string& path = ck->path;
  MT_CHECK(
      s.model == to_string(m.cfg.model.name),
      "checkpoint '",
      path,
      "' is from model '",
      s.model,
      "' but model.name is '",
      m.cfg.model.name,
      "'; resume with the model it was trained with");
  // Parameters and buffers (model_state.h), in the same order.
  const NamedTensors mine = state_tensors(*m.model);
  MT_CHECK(
      mine.size() == ck->params.size(),
      "checkpoint '",
      path,
      "' has ",
      ck->params.size(),
      " parameter tensors (buffers included), this model has ",
      mine.size(),
      " (model.depth or another shape key differs?)");
  for (size_t i = 0; i < mine.size(); ++i) {
    MT_CHECK(
        mine[i].first == ck->params[i].first &&
            mine[i].second.sizes() == ck->params[i].second.sizes(),
        "checkpoint '",
        path,
        "' holds '",
        ck->params[i].first,
        "' ",
        ck->params[i].second.sizes(),
        " where this model has '",
        mine[i].first,
        "' ",
        mine[i].second.sizes(),
        " (model.hidden, model.depth or the data's shape differs)");
  }
  const int64_t batch = m.shape.effective_batch;
  MT_CHECK(
      s.epoch_samples % batch == 0,
      "checkpoint '",
      path,
      "' stopped after ",
      s.epoch_samples,
      " samples of epoch ",
      s.epoch + 1,
      ", not a window boundary of this run's effective "
      "batch ",
      batch,
      "; set training.effective_batch_size=",
      s.effective_batch,
      " (the checkpoint's)");
  {
    memory::DeviceScope device;  // optimizer state is device memory
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < mine.size(); ++i) {
      mine[i].second.copy_(ck->params[i].second);  // to the device
    }
    try {
      // Onto this rank's device, whatever device wrote it: state saved by
      // rank 0 on cuda:0 must not land on cuda:0 on every rank (the first
      // step of local rank >= 1 would fail), and a GPU run's checkpoint
      // resumes on a CPU and the other way. The weights are copied into
      // the model's own tensors above; the generator states are host bytes.
      torch::serialize::InputArchive archive;
      archive.load_from(
          ck->optimizer.data(), ck->optimizer.size(), m.placement.device());
      m.optimizer->load(archive);
    } catch (const c10::Error& e) {
      throw Error(
          "checkpoint '" + path +
          "': its optimizer state does not fit training.optimizer=" +
          to_string(m.cfg.training.optimizer) + " (" +
          e.what_without_backtrace() + ")");
    }
  }
  m.scaler->restore(s.loss_scale, s.scaler_good_steps, s.scaler_skipped);
  if (!m.scaler->enabled())
    counters.nonfinite_skips = s.scaler_skipped;
  counters.nonfinite_in_a_row = s.nonfinite_in_a_row;
  // The best so far, when it was ranked by the same metric under the same
  // validation settings (a checkpoint from before validation.padding and
  // the Dice rule existed scored val_dice otherwise: Note [One Dice]).
  std::string note;
  const std::string changed = validation_changed(s.config_yaml, m.cfg);
  if (s.best_metric == best_metric(m) && changed.empty()) {
    counters.best_value = s.best_value;
    counters.best_step = s.best_step;
  } else if (!changed.empty()) {
    note += " (best.safetensors ranks anew: validation." + changed +
            " is not the checkpoint's)";
  }
  if (s.world_size == m.comm.size() &&
      static_cast<int64_t>(ck->rng.size()) == s.world_size) {
    RngState rng;
    rng.cpu = ck->rng[m.comm.rank()];
    if (static_cast<int64_t>(ck->rng_device.size()) == s.world_size)
      rng.device = ck->rng_device[m.comm.rank()];
    m.placement.set_rng_state(rng);
  } else {
    note += " (written by " + std::to_string(s.world_size) +
            " ranks: random states not restored)";
  }
  ResumePoint at;
  at.resumed = true;
  at.step = s.step;
  at.epoch = s.epoch;
  at.window = s.epoch_samples / batch;
  at.epoch_loss = s.epoch_loss_sum;
  what = "resumed from " + path + " at step " + std::to_string(s.step) +
         ", epoch " + std::to_string(s.epoch + 1) + ", window " +
         std::to_string(at.window + 1) + note +
         (ck->metadata_checked
              ? ""
              : " (an older checkpoint format: its checksum covers the "
                "tensors, not the position)") +
         (skipped.empty() ? "" : "; skipped: " + skipped);
  return at;
}

}  // namespace memtrain
