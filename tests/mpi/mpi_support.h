#pragma once
// Helpers for tests that run under mpirun: a folder shared by the ranks,
// synthetic files made once, and a trainer run that returns its parameters.

#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "memtrain/data/synthetic/synthetic.h"
#include "memtrain/dist/mpi_communicator.h"
#include "memtrain/train/loop/trainer.h"
#include "test_support.h"

namespace memtrain {

inline int world_size() {
  int w = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  return w;
}

// A folder made by rank 0 and known to all ranks (one machine).
class SharedDir {
 public:
  explicit SharedDir(const std::string& name) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char buf[512] = {0};
    if (rank == 0) {
      dir_ = std::make_unique<test::TempDir>(name);
      std::strncpy(buf, dir_->path().c_str(), sizeof(buf) - 1);
    }
    MPI_Bcast(buf, sizeof(buf), MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = buf;
  }
  ~SharedDir() {
    MPI_Barrier(MPI_COMM_WORLD);  // nobody still reads when rank 0 removes
  }
  std::string file(const std::string& n) const {
    return path_ + "/" + n;
  }

 private:
  std::unique_ptr<test::TempDir> dir_;
  std::string path_;
};

// DIR/name, `spec`'s synthetic file, written by rank 0 while the others
// wait.
inline void make_shared_synthetic(
    const SharedDir& dir, const std::string& name, const SyntheticSpec& spec) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    make_synthetic(spec, dir.file(name));
  MPI_Barrier(MPI_COMM_WORLD);
}

inline void make_features(
    const SharedDir& dir,
    const std::string& name,
    int64_t samples,
    int64_t features = 12) {
  SyntheticSpec spec;
  spec.samples = samples;
  spec.features = features;
  spec.classes = 3;
  spec.seed = 5;
  make_shared_synthetic(dir, name, spec);
}

inline TrainConfig base_config(const std::string& train) {
  TrainConfig c;
  c.data.train = train;
  c.data.val = "";
  c.model.hidden = 16;
  c.training.lr = 1.0;  // the update is the gradient itself
  c.training.momentum = 0.0;
  c.training.epochs = 1;
  c.output.dir = "";
  c.dist.check_replicas = CheckReplicas::kWindow;
  return c;
}

struct RunResult {
  NamedTensors params;
  TrainSummary summary;
};

// faster_forms: Trainer::Options::faster_forms (false: a model keeps its
// lean form, for tests that measure it).
inline RunResult train(
    const TrainConfig& cfg, MPI_Comm comm_handle, bool faster_forms = true) {
  MpiCommunicator comm(comm_handle);
  Trainer::Options opts;
  opts.write_outputs = false;
  opts.faster_forms = faster_forms;
  Trainer t(cfg, comm, opts);
  RunResult r;
  r.summary = t.run();
  for (auto& [name, p] : t.named_parameters()) {
    r.params.emplace_back(name, p.detach().clone());
  }
  return r;
}

struct Resumed {
  RunResult run;
  std::string note;
};

// Like train(), but writing outputs (metrics, checkpoints) to cfg.output.dir
// and resuming from `spec` first when it is not empty.
inline Resumed train_out(
    const TrainConfig& cfg, MPI_Comm handle, const std::string& spec = "") {
  MpiCommunicator comm(handle);
  Trainer t(cfg, comm, Trainer::Options{});
  t.prepare();
  Resumed r;
  if (!spec.empty())
    r.note = t.resume(spec);
  r.run.summary = t.run();
  for (auto& [name, p] : t.named_parameters()) {
    r.run.params.emplace_back(name, p.detach().clone());
  }
  return r;
}

inline std::vector<double> losses(const RunResult& r) {
  std::vector<double> out;
  for (const auto& w : r.summary.window_results)
    out.push_back(w.loss);
  return out;
}

// The largest value of `field` over `r`'s windows.
inline int64_t max_over_windows(
    const RunResult& r, int64_t WindowResult::*field) {
  int64_t m = 0;
  for (const auto& w : r.summary.window_results)
    m = std::max(m, w.*field);
  return m;
}

// `model`'s parameters after one SGD step of `lr` from their gradients.
inline NamedTensors sgd_step(const torch::nn::Module& model, double lr) {
  NamedTensors out;
  torch::NoGradGuard no_grad;
  for (const auto& item : model.named_parameters()) {
    const auto& p = item.value();
    out.emplace_back(item.key(), (p - lr * p.grad()).clone());
  }
  return out;
}

// One window of 8 samples trained four ways from the same parameters:
// `dist` W x K x 2 on the world (K = 8 / (2 W)), `one` 1 x 1 x 8, `acc`
// 1 x 8 x 1 (both on this rank alone), `init` as `one` with a vanishing
// learning rate; `whole` is `one`'s config. Window weighting makes the
// first three one update.
struct SplitRuns {
  TrainConfig whole;
  RunResult dist, one, acc, init;
};

inline SplitRuns train_splits(TrainConfig cfg) {
  SplitRuns s;
  cfg.training.max_windows = 1;
  cfg.data.batch_size = 2;
  cfg.training.gradient_accumulation_steps = 8 / (2 * world_size());
  s.dist = train(cfg, MPI_COMM_WORLD);
  s.whole = cfg;
  s.whole.data.batch_size = 8;
  s.whole.training.gradient_accumulation_steps = 1;
  s.one = train(s.whole, MPI_COMM_SELF);
  TrainConfig single = cfg;
  single.data.batch_size = 1;
  single.training.gradient_accumulation_steps = 8;
  s.acc = train(single, MPI_COMM_SELF);
  TrainConfig untrained = s.whole;
  untrained.training.lr = 1e-30;
  s.init = train(untrained, MPI_COMM_SELF);
  return s;
}

inline double max_abs_diff(const NamedTensors& a, const NamedTensors& b);

// The four runs of train_splits are one update (parameters and window
// loss within 1e-5), equal to `reference` (a hand-written step from the
// same start), and far enough from the start to mean something.
inline void expect_one_update(
    const SplitRuns& s, const NamedTensors& reference) {
  EXPECT_LT(max_abs_diff(s.one.params, reference), 1e-5)
      << "trainer vs a hand-written step";
  EXPECT_LT(max_abs_diff(s.dist.params, s.one.params), 1e-5)
      << "world " << world_size();
  EXPECT_LT(max_abs_diff(s.acc.params, s.one.params), 1e-5);
  EXPECT_GT(max_abs_diff(s.init.params, s.one.params), 1e-3)
      << "the update must be large enough to mean something";
  for (const RunResult* r : {&s.dist, &s.acc}) {
    EXPECT_NEAR(
        r->summary.window_results.at(0).loss,
        s.one.summary.window_results.at(0).loss,
        1e-5);
  }
}

inline double max_abs_diff(const NamedTensors& a, const NamedTensors& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    m = std::max(m, (a[i].second - b[i].second).abs().max().item<double>());
  }
  return m;
}

}  // namespace memtrain
