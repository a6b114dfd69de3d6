#include "memtrain/train/logs/metrics.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "memtrain/train/logs/run_plot.h"
#include "memtrain/util/atomic_file.h"
#include "memtrain/util/error.h"
#include "memtrain/util/tb_events.h"

namespace memtrain {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// A window record's columns, then the epoch's (on its last window's row).
const char* const kWindowColumns[] = {
    "step",
    "epoch",
    "window",
    "loss",
    "lr",
    "samples_per_s",
    "samples",
    "effective_batch",
    "micro_batch",
    "accum_steps",
    "window_s",
    "t_data_s",
    "t_compute_s",
    "t_comm_exposed_s",
    "t_optimizer_s",
    "host_syncs",
    "mem_allocated",
    "mem_reserved",
    "mem_peak",
    "mem_peak_reserved",
    "host_reserved",
    "host_peak",
    "oom_retries",
    "cache_releases",
    "skipped_steps"};
const char* const kEpochColumns[] = {"train_loss", "val_loss"};
const char* const kDicePrefix = "val_dice_";

// A value as metrics.jsonl writes it (so the two read back equal); null
// and missing are empty.
std::string csv_value(const nlohmann::json& v) {
  if (v.is_null())
    return "";
  return v.is_string() ? csv_field(v.get<std::string>()) : v.dump();
}

void write_or_throw(
    std::FILE* f, const std::string& s, const std::string& path) {
  MT_CHECK(
      std::fwrite(s.data(), 1, s.size(), f) == s.size() && std::fflush(f) == 0,
      "cannot write '",
      path,
      "': ",
      std::strerror(errno));
}

std::FILE* open_or_throw(const std::string& path, const char* mode) {
  std::FILE* f = std::fopen(path.c_str(), mode);
  MT_CHECK(
      f != nullptr,
      "cannot open '",
      path,
      "' for writing: ",
      std::strerror(errno));
  return f;
}

float as_float(const nlohmann::json& v) {
  return static_cast<float>(v.get<double>());
}

// A resumed run's metrics.jsonl reads as one run: the records the
// checkpoint of window `step` in `epoch` covers are kept, later ones
// (windows run after the checkpoint by the run that stopped) are dropped.
bool covered_by_checkpoint(
    const nlohmann::json& j, int64_t step, int64_t epoch) {
  const std::string type = j.value("type", "");
  return type == "pretrained" ||  // the run's start
         (type == "window" || type == "checkpoint"
              ? j.value("step", int64_t{0}) <= step
              : j.value("epoch", int64_t{0}) < epoch);
}

}  // namespace

bool for_each_record(
    const std::string& path,
    const std::function<void(const nlohmann::json&, const std::string&)>& fn) {
  std::ifstream in(path);
  if (!in.good())
    return false;
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      continue;  // a line cut short by a crash
    }
    fn(j, line);
  }
  return true;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos)
    return s;
  std::string q = "\"";
  for (char c : s)
    q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::vector<std::string> metrics_class_names(
    const std::vector<std::string>& names, int64_t num_classes) {
  std::vector<std::string> out;
  for (int64_t c = 0; c < num_classes; ++c) {
    out.push_back(
        c < static_cast<int64_t>(names.size()) && !names[c].empty()
            ? names[c]
            : std::to_string(c));
  }
  return out;
}

std::vector<std::string> metrics_csv_header(
    const std::vector<std::string>& val_metrics,
    const std::vector<std::string>& dice_classes) {
  std::vector<std::string> h(
      std::begin(kWindowColumns), std::end(kWindowColumns));
  h.insert(h.end(), std::begin(kEpochColumns), std::end(kEpochColumns));
  h.insert(h.end(), val_metrics.begin(), val_metrics.end());
  for (const auto& name : dice_classes)
    h.push_back(kDicePrefix + name);
  return h;
}

// The CSV rows of a stream of records: the live log and the rebuild after a
// resume both go through it.
class MetricsLog::Csv {
 public:
  explicit Csv(const MetricsOutputs& out)
      : columns_(metrics_csv_header(out.val_metrics, out.dice_classes)),
        epoch_keys_(std::begin(kEpochColumns), std::end(kEpochColumns)),
        dice_classes_(out.dice_classes.size()) {
    epoch_keys_.insert(
        epoch_keys_.end(), out.val_metrics.begin(), out.val_metrics.end());
  }

  std::string header() const {
    std::string line;
    for (const auto& c : columns_)
      line += (line.empty() ? "" : ",") + csv_field(c);
    return line + "\n";
  }

  // The row `record` completes, if any.
  std::string add(const nlohmann::json& record) {
    const std::string type = record.value("type", "");
    if (type == "window") {
      std::string done = finish();
      pending_ = record;
      return done;
    }
    if (pending_.is_null())
      return "";
    if (type == "validation" && record.contains("val_dice_per_class")) {
      pending_["val_dice_per_class"] = record["val_dice_per_class"];
    } else if (type == "epoch") {
      for (const std::string& key : epoch_keys_) {
        if (record.contains(key))
          pending_[key] = record[key];
      }
      return finish();
    }
    return "";
  }

  // The pending row (the last window's), if any.
  std::string finish() {
    if (pending_.is_null())
      return "";
    std::string line;
    const size_t per_class_at = columns_.size() - dice_classes_;
    for (size_t i = 0; i < columns_.size(); ++i) {
      nlohmann::json v;
      if (i >= per_class_at) {
        const auto& per =
            pending_.value("val_dice_per_class", nlohmann::json());
        if (per.is_array() && i - per_class_at < per.size())
          v = per[i - per_class_at];
      } else if (pending_.contains(columns_[i])) {
        v = pending_[columns_[i]];
      }
      line += (i ? "," : "") + csv_value(v);
    }
    pending_ = nullptr;
    return line + "\n";
  }

 private:
  std::vector<std::string> columns_;
  std::vector<std::string> epoch_keys_;  // what an epoch record adds
  size_t dice_classes_;
  nlohmann::json pending_;
};

MetricsLog::MetricsLog() = default;

MetricsLog::MetricsLog(const MetricsOutputs& out)
    : out_(out),
      rows_(std::make_unique<Csv>(out)),
      last_step_(out.resume_step) {
  if (out_.dir.empty())
    return;
  const std::string jsonl = out_.dir + "/metrics.jsonl";
  const std::string csv = out_.dir + "/metrics.csv";
  if (out_.resumed) {
    // One pass: metrics.jsonl trimmed, and metrics.csv = the rows of what
    // is kept; the last window's row stays open: a resumed run may validate
    // and end its epoch first.
    std::string kept, text = rows_->header();
    const bool found = for_each_record(
        jsonl, [&](const nlohmann::json& j, const std::string& line) {
          if (!covered_by_checkpoint(j, out_.resume_step, out_.resume_epoch))
            return;
          kept += line + "\n";
          text += rows_->add(j);
        });
    if (found)
      write_file_atomically(jsonl, kept);
    write_file_atomically(csv, text);
  }
  jsonl_ = open_or_throw(jsonl, out_.resumed ? "a" : "w");
  csv_ = open_or_throw(csv, out_.resumed ? "a" : "w");
  if (!out_.resumed)
    write_or_throw(csv_, rows_->header(), csv);
  // Later steps of earlier files (another timeline, or a run started
  // afresh in this folder) are dropped from here on.
  tb_ = std::make_unique<tb::EventWriter>(out_.dir + "/tb");
  tb_->session_start(out_.resume_step + 1);
}

MetricsLog::~MetricsLog() {
  if (drawing_.joinable())
    drawing_.join();
  if (csv_) {
    const std::string last = rows_->finish();
    std::fwrite(last.data(), 1, last.size(), csv_);
    std::fclose(csv_);
  }
  if (jsonl_)
    std::fclose(jsonl_);
}

void MetricsLog::write(const nlohmann::json& record) {
  if (!jsonl_)
    return;
  write_or_throw(jsonl_, record.dump() + "\n", out_.dir + "/metrics.jsonl");
  write_or_throw(csv_, rows_->add(record), out_.dir + "/metrics.csv");
  write_tb(record);
  if (record.value("type", "") == "epoch")
    start_drawing();
}

void MetricsLog::write_tb(const nlohmann::json& r) {
  const std::string type = r.value("type", "");
  tb::Scalars s;
  auto add = [&](const std::string& tag, const char* key) {
    if (r.contains(key) && r[key].is_number())
      s.emplace_back(tag, as_float(r[key]));
  };
  if (type == "window") {
    last_step_ = r.value("step", last_step_);
    add("train/loss", "loss");
    add("train/lr", "lr");
    add("train/samples_per_s", "samples_per_s");
    const double peak = r.value("mem_peak", 0.0);
    s.emplace_back("memory/peak_MiB", float(peak / kMiB));
    s.emplace_back(
        "memory/reserved_MiB", float(r.value("mem_reserved", 0.0) / kMiB));
    if (out_.budget_bytes > 0) {
      s.emplace_back("memory/budget_MiB", float(out_.budget_bytes / kMiB));
      s.emplace_back("memory/peak_of_budget", float(peak / out_.budget_bytes));
    }
  } else if (type == "validation") {
    add("val/loss", "val_loss");
    for (const std::string& key : out_.val_metrics)  // "val_x": "val/x"
      add("val/" + key.substr(key.rfind("val_", 0) == 0 ? 4 : 0), key.c_str());
    const auto per = r.value("val_dice_per_class", nlohmann::json::array());
    for (size_t c = 0; c < per.size() && c < out_.dice_classes.size(); ++c) {
      if (per[c].is_number())
        s.emplace_back("val/dice/" + out_.dice_classes[c], as_float(per[c]));
    }
  } else if (type == "epoch") {
    add("epoch/train_loss", "train_loss");
  }
  tb_->scalars(last_step_, s);
}

// Off the window loop: gnuplot runs on a thread of its own; the next
// epoch's drawing (or the destructor) waits for it.
void MetricsLog::start_drawing() {
  if (!out_.draw_progress)
    return;
  if (drawing_.joinable())
    drawing_.join();
  if (gnuplot_failed_)
    return;
  drawing_ = std::thread([this] {
    std::string why;
    try {
      why = draw_runs({load_run_curves(out_.dir)}, out_.dir + "/progress.png");
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (!why.empty()) {
      gnuplot_failed_ = true;
      std::fprintf(
          stderr,
          "memtrain: warning: progress.png not drawn: %s; training goes on "
          "(not tried again in this run)\n",
          why.c_str());
    }
  });
}

}  // namespace memtrain
