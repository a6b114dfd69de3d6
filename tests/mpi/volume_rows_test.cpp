// Per-volume validation of rows that belong to volumes (Note [Volume rows]):
// the per-volume Dice, its means, the accuracy and the dumped prediction
// grids are the same at 1, 2 and 4 ranks, and equal a hand computation
// from the dumped grids and the validation file; an OOM in validation
// halves the batch and changes no score.

#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "memtrain/data/h5/h5_dataset.h"
#include "mpi_support.h"

namespace memtrain {
namespace {

constexpr int64_t kF = 6, kF2 = 4;
const std::vector<int64_t> kIds = {3, 7, 10, 42, 99};

struct Rows {
  std::vector<float> x, ctx;
  std::vector<int64_t> labels, ids, voxels;  // voxels: 3 per row
  int64_t size() const {
    return static_cast<int64_t>(labels.size());
  }
};

void write(
    hid_t f,
    const char* name,
    const std::vector<hsize_t>& dims,
    hid_t type,
    hid_t mem,
    const void* data) {
  const hid_t sp = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
  const hid_t ds =
      H5Dcreate2(f, name, type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(ds, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  H5Dclose(ds);
  H5Sclose(sp);
}

// A /features file of `rows` (plain HDF5: contiguous, no checksum).
void write_rows(const std::string& path, const Rows& r) {
  const hid_t f =
      H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const hsize_t n = r.size();
  write(f, "features", {n, kF}, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, r.x.data());
  write(
      f,
      "context_features",
      {n, kF2},
      H5T_IEEE_F32LE,
      H5T_NATIVE_FLOAT,
      r.ctx.data());
  write(f, "labels", {n}, H5T_STD_I64LE, H5T_NATIVE_INT64, r.labels.data());
  write(f, "volume_ids", {n}, H5T_STD_I64LE, H5T_NATIVE_INT64, r.ids.data());
  write(
      f,
      "voxel_index",
      {n, 3},
      H5T_STD_I64LE,
      H5T_NATIVE_INT64,
      r.voxels.data());
  const int64_t classes = 2;
  const hid_t sp = H5Screate(H5S_SCALAR);
  const hid_t a =
      H5Acreate2(f, "num_classes", H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT64, &classes);
  H5Aclose(a);
  H5Sclose(sp);
  H5Fclose(f);
}

// train.h5: make-data patch-features, 4 volumes of 5^3. val.h5: 5 other
// volumes of 5^3 whose rows are shuffled, with ids 3, 7, 10, 42, 99 and
// every 7th row left out (positions without a row), so that validation
// has to group the rows itself.
void make_files(const SharedDir& dir, int64_t grid) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    SyntheticSpec spec;
    spec.kind = "patch-features";
    spec.volumes = 4;
    spec.grid = grid;
    spec.features = kF;
    spec.context = kF2;
    spec.classes = 2;
    spec.seed = 21;
    make_synthetic(spec, dir.file("train.h5"));
    spec.volumes = 5;
    spec.split = "val";
    make_synthetic(spec, dir.file("val-ordered.h5"));
    const H5Dataset ds = H5Dataset::open(dir.file("val-ordered.h5"), "t");
    const DatasetInfo& info = ds.info();
    std::vector<int64_t> keep;
    for (int64_t i = 0; i < info.num_samples; ++i) {
      if (i % 7 != 3)
        keep.push_back(i);
    }
    std::shuffle(keep.begin(), keep.end(), std::mt19937(5));
    Rows r;
    r.x.resize(keep.size() * kF);
    r.ctx.resize(keep.size() * kF2);
    r.labels.resize(keep.size());
    ds.read(keep, r.x.data(), r.labels.data(), r.ctx.data());
    for (int64_t i : keep) {
      r.ids.push_back(kIds.at(info.row_volume_ids[i]));
      const auto& v = info.row_voxel_index[i];
      r.voxels.insert(r.voxels.end(), v.begin(), v.end());
    }
    write_rows(dir.file("val.h5"), r);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TrainConfig rows_config(const SharedDir& dir) {
  TrainConfig c = base_config(dir.file("train.h5"));
  c.data.val = dir.file("val.h5");
  c.data.batch_size = 8;
  c.data.val_batch_size = 7;  // batches span volumes
  // The initial model (model.seed alone): its parameters are the same at
  // every world size, so any difference would be validation's own.
  c.training.lr = 1e-30;
  c.training.epochs = 1;
  return c;
}

RunResult train_with_outputs(const TrainConfig& cfg, MPI_Comm comm_handle) {
  MpiCommunicator comm(comm_handle);
  Trainer::Options opts;
  opts.write_outputs = true;
  Trainer t(cfg, comm, opts);
  RunResult r;
  r.summary = t.run();
  return r;
}

// `/prediction` of a dumped file, its shape, and its volume_id and dice
// attributes.
struct Dump {
  std::vector<hsize_t> dims;
  std::vector<int16_t> grid;
  int64_t volume_id = -1;
  double dice = 0;
};

Dump read_dump(const std::string& path) {
  Dump d;
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  EXPECT_GE(f, 0) << path;
  if (f < 0)
    return d;
  const hid_t ds = H5Dopen2(f, "prediction", H5P_DEFAULT);
  const hid_t sp = H5Dget_space(ds);
  d.dims.resize(H5Sget_simple_extent_ndims(sp));
  H5Sget_simple_extent_dims(sp, d.dims.data(), nullptr);
  d.grid.resize(H5Sget_simple_extent_npoints(sp));
  H5Dread(ds, H5T_NATIVE_INT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, d.grid.data());
  const hid_t a1 = H5Aopen(f, "volume_id", H5P_DEFAULT);
  const hid_t a2 = H5Aopen(f, "dice", H5P_DEFAULT);
  H5Aread(a1, H5T_NATIVE_INT64, &d.volume_id);
  H5Aread(a2, H5T_NATIVE_DOUBLE, &d.dice);
  H5Aclose(a1);
  H5Aclose(a2);
  H5Sclose(sp);
  H5Dclose(ds);
  H5Fclose(f);
  return d;
}

bool same(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || a == b;
}

// A validation's scores: its metrics and the validation record's fields
// (ValResult::details), null read as NaN.
struct Scores {
  std::map<int64_t, double> volume_dice;
  std::vector<double> dice_per_class;
  double dice = 0, accuracy = 0, loss = 0;
  int64_t samples = 0, volumes = 0, batch = 0;
};

double number(const nlohmann::json& j) {
  return j.is_null() ? std::nan("") : j.get<double>();
}

Scores scores(const ValResult& v) {
  const nlohmann::json d = nlohmann::json::parse(v.details);
  Scores s;
  for (const auto& c : d.at("val_cases"))
    s.volume_dice[std::stoll(c.at("case").get<std::string>())] =
        number(c.at("mean"));
  for (const auto& c : d.at("val_dice_per_class"))
    s.dice_per_class.push_back(number(c));
  s.dice = v.metric("val_dice");
  s.accuracy = v.metric("val_accuracy");
  s.loss = v.loss;
  s.samples = v.samples;
  s.volumes = d.at("val_volumes").get<int64_t>();
  s.batch = v.batch;
  return s;
}

// NaN-aware equality of two results' scores.
void expect_same_scores(const ValResult& va, const ValResult& vb) {
  const Scores a = scores(va), b = scores(vb);
  ASSERT_EQ(a.volume_dice.size(), b.volume_dice.size());
  for (const auto& [id, d] : a.volume_dice) {
    ASSERT_EQ(b.volume_dice.count(id), 1u) << id;
    EXPECT_TRUE(same(d, b.volume_dice.at(id)))
        << "volume " << id << ": " << d << " vs " << b.volume_dice.at(id);
  }
  ASSERT_EQ(a.dice_per_class.size(), b.dice_per_class.size());
  for (size_t c = 0; c < a.dice_per_class.size(); ++c)
    EXPECT_TRUE(same(a.dice_per_class[c], b.dice_per_class[c])) << c;
  EXPECT_TRUE(same(a.dice, b.dice)) << a.dice << " vs " << b.dice;
  EXPECT_EQ(a.accuracy, b.accuracy);
  EXPECT_EQ(a.samples, b.samples);
  EXPECT_EQ(a.volumes, b.volumes);
  EXPECT_NEAR(a.loss, b.loss, 1e-6);
}

TEST(VolumeRows, DiceIsExactAtEveryWorldSizeAndEqualsTheDumps) {
  SharedDir dir("volume_rows");
  make_files(dir, 5);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  TrainConfig c = rows_config(dir);
  c.validation.dump_predictions = true;
  c.output.dir = dir.file("world");
  const RunResult world = train_with_outputs(c, MPI_COMM_WORLD);
  c.output.dir = dir.file("self-" + std::to_string(rank));
  const RunResult self = train_with_outputs(c, MPI_COMM_SELF);
  ASSERT_EQ(world.summary.validations.size(), 1u);
  ASSERT_EQ(self.summary.validations.size(), 1u);
  expect_same_scores(world.summary.validations[0], self.summary.validations[0]);
  const Scores w = scores(world.summary.validations[0]);
  EXPECT_EQ(w.volumes, 5);
  EXPECT_EQ(w.batch, 7);
  std::vector<int64_t> ids;
  for (const auto& [id, d] : w.volume_dice)
    ids.push_back(id);
  EXPECT_EQ(ids, kIds);
  MPI_Barrier(MPI_COMM_WORLD);  // every rank's dumps are written

  // By hand, from the dumps of the world run and the validation file.
  const H5Dataset val = H5Dataset::open(dir.file("val.h5"), "t");
  const DatasetInfo& info = val.info();
  EXPECT_EQ(w.samples, info.num_samples);
  std::map<int64_t, std::vector<int64_t>> rows_of;
  for (int64_t i = 0; i < info.num_samples; ++i)
    rows_of[info.row_volume_ids[i]].push_back(i);
  std::map<int64_t, double> per_volume;
  std::vector<double> class_sum(2, 0.0), class_n(2, 0.0);
  int64_t correct = 0, holes = 0;
  std::set<int64_t> predicted;
  for (int64_t id : kIds) {
    const std::string name =
        "/val/epoch-001/volume-" + std::to_string(id) + ".h5";
    const Dump d = read_dump(dir.file("world") + name);
    EXPECT_EQ(d.dims, (std::vector<hsize_t>{5, 5, 5})) << id;
    EXPECT_EQ(d.volume_id, id);
    EXPECT_EQ(read_dump(dir.file("self-0") + name).grid, d.grid)
        << "volume " << id << ": the 1-rank run predicted otherwise";
    std::vector<int64_t> inter(2, 0), pred(2, 0), truth(2, 0);
    for (int64_t r : rows_of[id]) {
      const auto& v = info.row_voxel_index[r];
      const int64_t p = d.grid.at((v[0] * 5 + v[1]) * 5 + v[2]);
      ASSERT_TRUE(p == 0 || p == 1) << "row " << r << " holds " << p;
      const int64_t y = info.row_labels[r];
      predicted.insert(p);
      correct += p == y;
      inter[p] += p == y;
      ++pred[p];
      ++truth[y];
    }
    holes += std::count(d.grid.begin(), d.grid.end(), int16_t{-1});
    // Note [One Dice]: a class the volume's labels lack has no Dice.
    double fg = std::nan("");
    for (int c = 0; c < 2; ++c) {
      if (truth[c] == 0)
        continue;
      const double dc = 2.0 * inter[c] / double(pred[c] + truth[c]);
      class_sum[c] += dc;
      class_n[c] += 1;
      if (c == 1)
        fg = dc;
    }
    per_volume[id] = fg;
    EXPECT_TRUE(same(d.dice, fg)) << id;
    EXPECT_TRUE(same(w.volume_dice.at(id), fg))
        << "volume " << id << ": " << w.volume_dice.at(id) << " vs " << fg;
  }
  EXPECT_EQ(holes, 5 * 125 - info.num_samples) << "-1 where no row";
  EXPECT_EQ(predicted, (std::set<int64_t>{0, 1}))
      << "a model that predicts one class would make a weak test";
  EXPECT_DOUBLE_EQ(w.dice_per_class[0], class_sum[0] / class_n[0]);
  EXPECT_DOUBLE_EQ(w.dice_per_class[1], class_sum[1] / class_n[1]);
  // val_dice: DiceMetric's "mean", over the volumes that have a Dice.
  double mean = 0;
  int counted = 0;
  for (const auto& [id, d] : per_volume) {
    if (!std::isnan(d)) {
      mean += d;
      ++counted;
    }
  }
  EXPECT_DOUBLE_EQ(w.dice, mean / counted);
  // The epoch's summary.json: every volume, as the record.
  std::ifstream in(dir.file("world") + "/val/epoch-001/summary.json");
  ASSERT_TRUE(in) << "no summary.json";
  const nlohmann::json summary = nlohmann::json::parse(in);
  ASSERT_EQ(summary.at("metric_per_case").size(), kIds.size());
  EXPECT_DOUBLE_EQ(summary.at("case_mean").at("Dice").get<double>(), w.dice);
  EXPECT_DOUBLE_EQ(w.accuracy, double(correct) / info.num_samples);
  int distinct = 0;
  for (const auto& [id, d] : per_volume)
    distinct += d > 0 && d < 1 && d != per_volume.begin()->second;
  EXPECT_GT(distinct, 0) << "the volumes' Dice should differ";
}

// A validation batch of every row under a budget that holds training's
// micro-batch only: the batch is halved (on every rank that ran out) and
// the scores are those of the run without a budget.
TEST(VolumeRows, ValidationOomHalvesTheBatchAndKeepsTheScores) {
  SharedDir dir("volume_rows_oom");
  make_files(dir, 8);
  TrainConfig c = rows_config(dir);
  c.model.hidden = 256;  // a row's activations: 4 KiB a layer
  c.data.val_batch_size = 5 * 512;
  const RunResult free_run = train(c, MPI_COMM_WORLD);
  ASSERT_EQ(free_run.summary.validations.size(), 1u);
  EXPECT_EQ(free_run.summary.validations[0].oom_retries, 0);
  int64_t peak = 0;
  for (const auto& w : free_run.summary.window_results)
    peak = std::max(peak, w.mem_peak_reserved);
  c.memory.budget = std::to_string(peak + (int64_t{1} << 20));
  const RunResult tight = train(c, MPI_COMM_WORLD);
  ASSERT_EQ(tight.summary.validations.size(), 1u);
  const ValResult& v = tight.summary.validations[0];
  EXPECT_GT(v.oom_retries, 0);
  EXPECT_LT(v.batch, 5 * 512);
  EXPECT_EQ(tight.summary.oom_retries, 0) << "training itself fitted";
  expect_same_scores(v, free_run.summary.validations[0]);
}

}  // namespace
}  // namespace memtrain
