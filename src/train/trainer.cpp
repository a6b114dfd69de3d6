#include "memtrain/train/trainer.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <optional>
#include <sstream>

#include "memtrain/compat.h"
#include "memtrain/data/h5_dataset.h"
#include "memtrain/data/sharded_sampler.h"
#include "memtrain/dist/communicator.h"
#include "memtrain/dist/gradient_sync.h"
#include "memtrain/dist/replica_check.h"
#include "memtrain/model/models.h"
#include "memtrain/train/batch_loader.h"
#include "memtrain/train/metrics.h"
#include "memtrain/train/progress.h"
#include "memtrain/util/atomic_file.h"
#include "memtrain/util/error.h"

namespace memtrain {

// Note [Window weighting]
// A window's update must equal one step on its global batch of n samples
// (DESIGN.md semantics 1), however the n samples are split over ranks and
// micro-steps, and whatever size the last micro-batch has. Each micro-step
// therefore back-propagates sum(per-sample loss) / n, with n the window's
// global sample count that every rank knows from the sampler, and the
// boundary all-reduce *sums* over ranks. The sum of all those gradients is
// exactly the gradient of the mean loss over the n samples: the division
// happens once, in the loss, and no rank divides by the world size or by K.

namespace {

constexpr int64_t kExtras = 2;  // [loss sum, sample count] in the last bucket

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(
      buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

struct Trainer::Impl {
  TrainConfig cfg;
  Communicator& comm;
  Options options;
  bool writer = false;  // rank 0 with outputs on

  std::optional<H5Dataset> train_data;
  std::optional<H5Dataset> val_data;
  std::shared_ptr<Classifier> model;
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<ShardedSampler> sampler;
  std::unique_ptr<GradientSync> grad_sync;
  std::unique_ptr<BatchLoader> loader;
  std::unique_ptr<MetricsLog> metrics;
  std::unique_ptr<Progress> progress;

  Impl(const TrainConfig& c, Communicator& comm_, Options o)
      : cfg(c), comm(comm_), options(o) {}

  void open_data();
  void build_model();
  WindowResult run_window(const WindowPlan& plan);
  ValResult validate();
  void check_replicas(const char* when, uint64_t* checksum);
  nlohmann::json window_record(const WindowResult& r) const;
};

void Trainer::Impl::open_data() {
  train_data.emplace(H5Dataset::open(cfg.data.train, "data.train"));
  const DatasetInfo& ti = train_data->info();
  if (!cfg.data.val.empty()) {
    val_data.emplace(H5Dataset::open(cfg.data.val, "data.val"));
    const DatasetInfo& vi = val_data->info();
    MT_CHECK(
        vi.kind == ti.kind && vi.sample_shape == ti.sample_shape,
        "data.val: '",
        vi.path,
        "' holds ",
        to_string(vi.kind),
        " of another shape than data.train '",
        ti.path,
        "'; both files must hold the same kind and sample shape");
    MT_CHECK(
        vi.num_classes <= ti.num_classes,
        "data.val: '",
        vi.path,
        "' has ",
        vi.num_classes,
        " classes but data.train '",
        ti.path,
        "' has ",
        ti.num_classes,
        "; the model is sized by data.train");
  }
}

void Trainer::Impl::build_model() {
  const DatasetInfo& ti = train_data->info();
  model = make_model(cfg.model, {ti.kind, ti.sample_shape, ti.num_classes});
  model->train();
  params = model->parameters();
  if (cfg.training.optimizer == "sgd") {
    optimizer = std::make_unique<torch::optim::SGD>(
        params,
        torch::optim::SGDOptions(cfg.training.lr)
            .momentum(cfg.training.momentum)
            .weight_decay(cfg.training.weight_decay));
  } else {
    optimizer = std::make_unique<torch::optim::AdamW>(
        params,
        torch::optim::AdamWOptions(cfg.training.lr)
            .weight_decay(cfg.training.weight_decay));
  }
  sampler = std::make_unique<ShardedSampler>(
      ti.num_samples,
      cfg.data.batch_size,
      cfg.training.gradient_accumulation_steps,
      comm.rank(),
      comm.size(),
      static_cast<uint64_t>(cfg.data.seed),
      cfg.data.drop_last);
  grad_sync = std::make_unique<GradientSync>(
      comm,
      params,
      static_cast<int64_t>(cfg.dist.bucket_mib * 1024.0 * 1024.0),
      kExtras);
  loader = std::make_unique<BatchLoader>(*train_data);
}

Trainer::Trainer(const TrainConfig& cfg, Communicator& comm, Options options)
    : impl_(std::make_unique<Impl>(cfg, comm, options)) {
  Impl& m = *impl_;
  m.writer = options.write_outputs && comm.rank() == 0;
  m.open_data();
  m.build_model();
  if (m.writer) {
    make_directories(cfg.output.dir);
    m.metrics = std::make_unique<MetricsLog>(cfg.output.dir + "/metrics.jsonl");
  } else {
    m.metrics = std::make_unique<MetricsLog>("");
  }
  m.progress = std::make_unique<Progress>(
      comm.rank() == 0 ? options.progress : nullptr,
      options.progress_is_tty,
      cfg.output.progress_every_s);
}

Trainer::~Trainer() = default;

WindowResult Trainer::Impl::run_window(const WindowPlan& plan) {
  const auto start = Clock::now();
  const CommStats before = comm.stats();
  WindowResult r;
  r.epoch = plan.epoch;
  r.window = plan.window;
  r.samples = plan.global_samples;

  // 1. Micro-steps: forward and backward on this rank's micro-batches,
  //    gradients accumulating locally. No communication here.
  //    See Note [All-reduce only at the accumulation boundary].
  const double inv_n = 1.0 / static_cast<double>(plan.global_samples);
  double loss_sum = 0.0;
  for (const auto& indices : plan.micro_batches) {
    Batch batch = loader->load(indices);
    torch::Tensor logits = model->forward(batch.x);
    torch::Tensor loss = torch::nn::functional::cross_entropy(
        logits,
        batch.y,
        torch::nn::functional::CrossEntropyFuncOptions().reduction(
            torch::kSum));
    // See Note [Window weighting].
    (loss * inv_n).backward();
    loss_sum += loss.item<double>();
    ++r.micro_steps;
    // batch, logits and loss (and with them the graph) die here: nothing of
    // micro-step k is alive during micro-step k+1.
  }

  // 2. Boundary: one bucketed all-reduce of gradient + [loss sum, samples].
  std::vector<float> extras = {
      static_cast<float>(loss_sum), static_cast<float>(plan.rank_samples)};
  grad_sync->sync(extras);
  r.loss = extras[0] / extras[1];
  MT_INTERNAL_ASSERT(
      static_cast<int64_t>(extras[1]) == plan.global_samples,
      "ranks disagree on the window's samples");

  // 3. Update, then drop the gradients (set to none, not zero).
  if (cfg.training.grad_clip_norm > 0) {
    torch::nn::utils::clip_grad_norm_(params, cfg.training.grad_clip_norm);
  }
  optimizer->step();
  compat::zero_grad_to_none(*optimizer);

  r.allreduce_calls = comm.stats().allreduce_calls - before.allreduce_calls;
  r.allreduce_bytes = comm.stats().allreduce_bytes - before.allreduce_bytes;
  r.data_wait_s = loader->take_wait_seconds();
  r.seconds = seconds_since(start);
  return r;
}

ValResult Trainer::Impl::validate() {
  torch::NoGradGuard no_grad;
  model->eval();
  const int64_t n = val_data->info().num_samples;
  const int64_t begin = n * comm.rank() / comm.size();
  const int64_t end = n * (comm.rank() + 1) / comm.size();
  BatchLoader val_loader(*val_data);
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int64_t s = begin; s < end; s += cfg.data.batch_size) {
    std::vector<int64_t> idx;
    for (int64_t i = s; i < std::min(end, s + cfg.data.batch_size); ++i) {
      idx.push_back(i);
    }
    Batch b = val_loader.load(idx);
    torch::Tensor logits = model->forward(b.x);
    loss_sum += torch::nn::functional::cross_entropy(
                    logits,
                    b.y,
                    torch::nn::functional::CrossEntropyFuncOptions().reduction(
                        torch::kSum))
                    .item<double>();
    correct += logits.argmax(1).eq(b.y).sum().item<int64_t>();
  }
  model->train();
  auto totals = torch::tensor(
      {loss_sum,
       static_cast<double>(correct),
       static_cast<double>(end - begin)},
      torch::kFloat64);
  comm.all_reduce_sum(totals);
  const double count = totals[2].item<double>();
  return {
      totals[0].item<double>() / count,
      totals[1].item<double>() / count,
      static_cast<int64_t>(count)};
}

void Trainer::Impl::check_replicas(const char* when, uint64_t* checksum) {
  if (!replicas_identical(comm, params, checksum)) {
    throw InternalError(
        std::string("replica check failed ") + when +
        ": this rank's parameters (checksum " + hex(*checksum) +
        ") differ from rank 0's. Likely causes: ranks run "
        "different memtrain or LibTorch builds, "
        "non-deterministic kernels, or a memory error.");
  }
}

nlohmann::json Trainer::Impl::window_record(const WindowResult& r) const {
  return {
      {"type", "window"},
      {"epoch", r.epoch},
      {"window", r.window},
      {"step", r.step},
      {"loss", r.loss},
      {"lr", cfg.training.lr},
      {"micro_batch", cfg.data.batch_size},
      {"accum_steps", cfg.training.gradient_accumulation_steps},
      {"effective_batch", sampler->effective_batch()},
      {"samples", r.samples},
      {"samples_per_s", r.samples / std::max(r.seconds, 1e-9)},
      {"allreduce_calls", r.allreduce_calls},
      {"allreduce_bytes", r.allreduce_bytes},
      {"data_wait_s", r.data_wait_s},
      {"window_s", r.seconds}};
}

TrainSummary Trainer::run() {
  Impl& m = *impl_;
  TrainSummary summary;
  // Start every replica from rank 0's parameters (they are equal by seed;
  // this makes it so whatever the nodes' LibTorch builds draw).
  {
    torch::NoGradGuard no_grad;
    for (auto& p : m.params)
      m.comm.broadcast(p, 0);
  }
  if (m.writer) {
    write_file_atomically(
        m.cfg.output.dir + "/config.resolved.yaml", m.cfg.to_yaml());
  }
  const int64_t epochs = m.cfg.training.epochs;
  const int64_t wpe = m.sampler->windows_per_epoch();
  int64_t total = epochs * wpe;
  if (m.cfg.training.max_windows > 0) {
    total = std::min(total, m.cfg.training.max_windows);
  }
  const bool check_each_window = m.cfg.dist.check_replicas == "window";
  const bool check_each_epoch = m.cfg.dist.check_replicas != "off";
  bool checked_last = false;

  for (int64_t epoch = 0; epoch < epochs && summary.windows < total; ++epoch) {
    const auto epoch_start = Clock::now();
    double epoch_loss = 0.0;
    int64_t epoch_samples = 0;
    int64_t w = 0;
    for (; w < wpe && summary.windows < total; ++w) {
      WindowResult r = m.run_window(m.sampler->plan(epoch, w));
      r.step = ++summary.windows;
      epoch_loss += r.loss * r.samples;
      epoch_samples += r.samples;
      m.metrics->write(m.window_record(r));
      m.progress->window(
          epoch,
          epochs,
          w,
          wpe,
          r.loss,
          r.samples / std::max(r.seconds, 1e-9),
          summary.windows,
          total);
      summary.window_results.push_back(r);
      checked_last = false;
      if (check_each_window) {
        m.check_replicas("after a window", &summary.checksum);
        checked_last = true;
      }
    }
    if (w < wpe)
      break;  // stopped by max_windows inside the epoch

    nlohmann::json rec = {
        {"type", "epoch"},
        {"epoch", epoch},
        {"windows", wpe},
        {"train_loss", epoch_loss / epoch_samples}};
    std::ostringstream line;
    line << "epoch " << epoch + 1 << "/" << epochs << " done: train loss "
         << epoch_loss / epoch_samples;
    if (m.val_data) {
      const auto val_start = Clock::now();
      const ValResult v = m.validate();
      summary.validations.push_back(v);
      rec["val_loss"] = v.loss;
      rec["val_accuracy"] = v.accuracy;
      rec["val_samples"] = v.samples;
      rec["val_seconds"] = seconds_since(val_start);
      line << ", val loss " << v.loss << ", val accuracy " << v.accuracy;
    }
    if (check_each_epoch && !checked_last) {
      m.check_replicas("at the end of an epoch", &summary.checksum);
      checked_last = true;
    }
    if (check_each_epoch) {
      rec["param_checksum"] = hex(summary.checksum);
      rec["replicas_identical"] = true;
    }
    rec["epoch_s"] = seconds_since(epoch_start);
    line << " (" << format_duration(seconds_since(epoch_start)) << ")";
    m.metrics->write(rec);
    m.progress->line(line.str());
  }
  if (check_each_epoch && !checked_last) {
    m.check_replicas("at the end of training", &summary.checksum);
  } else if (!check_each_epoch) {
    summary.checksum = parameter_checksum(m.params);
  }
  if (m.writer) {
    save_safetensors(
        m.cfg.output.dir + "/model.safetensors",
        named_parameters(),
        {{"format", "pt"},
         {"producer", "memtrain"},
         {"model", m.cfg.model.name},
         {"windows", std::to_string(summary.windows)}});
  }
  // No rank returns (and maybe exits) before rank 0 has written the model.
  m.comm.barrier();
  return summary;
}

std::string Trainer::describe() const {
  const Impl& m = *impl_;
  const DatasetInfo& ti = m.train_data->info();
  std::ostringstream out;
  auto shape = [](const std::vector<int64_t>& s) {
    std::string t = "[";
    for (size_t i = 0; i < s.size(); ++i) {
      t += (i ? "," : "") + std::to_string(s[i]);
    }
    return t + "]";
  };
  out << "data: train '" << ti.path << "' " << ti.num_samples << " x "
      << to_string(ti.kind) << " " << shape(ti.sample_shape) << " "
      << ti.sample_dtype << ", " << ti.num_classes << " classes";
  if (m.val_data) {
    out << "; val '" << m.val_data->info().path << "' "
        << m.val_data->info().num_samples;
  }
  int64_t numel = 0;
  for (const auto& p : m.params)
    numel += p.numel();
  out << "\nmodel: " << m.cfg.model.name << " (hidden " << m.cfg.model.hidden
      << ", norm " << m.cfg.model.norm << "), " << numel << " parameters ("
      << format_bytes(numel * 4.0) << " fp32), optimizer "
      << m.cfg.training.optimizer << " lr " << m.cfg.training.lr
      << "\nwindow: effective batch " << m.sampler->effective_batch() << " = "
      << m.comm.size() << " ranks x "
      << m.cfg.training.gradient_accumulation_steps << " micro-steps x "
      << m.cfg.data.batch_size << "; " << m.sampler->windows_per_epoch()
      << " windows/epoch; gradient sync: " << m.grad_sync->num_buckets()
      << " bucket(s), "
      << format_bytes(static_cast<double>(m.grad_sync->bytes_per_sync()))
      << " per window over " << m.comm.backend();
  return out.str();
}

NamedTensors Trainer::named_parameters() const {
  NamedTensors out;
  for (const auto& item : impl_->model->named_parameters()) {
    out.emplace_back(item.key(), item.value());
  }
  return out;
}

int64_t Trainer::windows_per_epoch() const {
  return impl_->sampler->windows_per_epoch();
}

int64_t Trainer::effective_batch() const {
  return impl_->sampler->effective_batch();
}

}  // namespace memtrain
