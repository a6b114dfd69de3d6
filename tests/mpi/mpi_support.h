#pragma once
// Helpers for tests that run under mpirun: a folder shared by the ranks,
// synthetic files made once, and a trainer run that returns its parameters.

#include <mpi.h>
#include <torch/torch.h>

#include <cstring>
#include <memory>
#include <string>

#include "memtrain/data/synthetic.h"
#include "memtrain/dist/mpi_communicator.h"
#include "memtrain/train/trainer.h"
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

inline void make_features(
    const SharedDir& dir,
    const std::string& name,
    int64_t samples,
    int64_t features = 12) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    SyntheticSpec spec;
    spec.samples = samples;
    spec.features = features;
    spec.classes = 3;
    spec.seed = 5;
    make_synthetic(spec, dir.file(name));
  }
  MPI_Barrier(MPI_COMM_WORLD);
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
  c.dist.check_replicas = "window";
  return c;
}

struct RunResult {
  NamedTensors params;
  TrainSummary summary;
};

inline RunResult train(const TrainConfig& cfg, MPI_Comm comm_handle) {
  MpiCommunicator comm(comm_handle);
  Trainer::Options opts;
  opts.write_outputs = false;
  Trainer t(cfg, comm, opts);
  RunResult r;
  r.summary = t.run();
  for (auto& [name, p] : t.named_parameters()) {
    r.params.emplace_back(name, p.detach().clone());
  }
  return r;
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
