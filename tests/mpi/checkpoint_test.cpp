// Checkpoints and resume, at every world size: a stopped and resumed run
// repeats the uninterrupted one bit for bit; a checkpoint resumes at another
// world size; corrupt and foreign checkpoints are refused and nothing is
// overwritten.

#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "memtrain/train/run_files/checkpoint.h"
#include "memtrain/train/state/stop_request.h"
#include "memtrain/util/error.h"
#include "mpi_support.h"

namespace memtrain {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TrainConfig ckpt_config(const SharedDir& dir, const std::string& out) {
  TrainConfig c = base_config(dir.file("train.h5"));
  c.model.hidden = 16;
  c.model.dropout = 0.2;  // the RNG state must travel too
  c.data.batch_size = 4;
  c.training.lr = 0.05;
  c.training.momentum = 0.9;  // and the optimizer state
  c.training.epochs = 3;
  c.training.checkpoint_every = 5;
  c.training.keep_checkpoints = 3;
  c.output.dir = dir.file(out);
  return c;
}

// `first` then `second` (resumed where `first` stopped) trained exactly as
// `whole`: the same losses window by window and the same final weights.
void expect_continues_exactly(
    const RunResult& whole, const RunResult& first, const RunResult& second) {
  std::vector<double> joined = losses(first);
  const std::vector<double> rest = losses(second);
  joined.insert(joined.end(), rest.begin(), rest.end());
  EXPECT_EQ(joined, losses(whole));  // exact, not approximate
  EXPECT_EQ(max_abs_diff(second.params, whole.params), 0.0);
}

TEST(Checkpoint, ResumeRepeatsTheUninterruptedRunBitForBit) {
  SharedDir dir("resume");
  make_features(dir, "train.h5", 200);
  const TrainConfig full = ckpt_config(dir, "full");
  const RunResult a = train_out(full, MPI_COMM_WORLD).run;

  TrainConfig part = ckpt_config(dir, "part");
  part.training.max_windows = a.summary.windows / 2 + 1;  // mid-epoch
  const RunResult first = train_out(part, MPI_COMM_WORLD).run;
  part.training.max_windows = 0;
  const Resumed second = train_out(part, MPI_COMM_WORLD, "auto");
  EXPECT_NE(second.note.find("resumed from"), std::string::npos) << second.note;

  expect_continues_exactly(a, first, second.run);
  EXPECT_EQ(
      second.run.summary.window_results.front().step,
      first.summary.windows + 1);
  // keep_checkpoints: at most 3 files.
  EXPECT_LE(list_checkpoints(part.output.dir).size(), 3u);
}

// `archive` (LibTorch's optimizer archive) as a GPU rank writes it: every
// tensor's storage located on cuda:0 -- the pickled ('storage', type, key,
// location, numel) tuples name "cpu" through one memoised string, rewritten
// here; the records are copied into a new archive.
std::string as_written_on_cuda0(const std::string& archive) {
  std::istringstream in(archive);
  caffe2::serialize::PyTorchStreamReader reader(&in);
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer(
      [&out](const void* data, size_t n) {
        out.append(static_cast<const char*>(data), n);
        return n;
      });
  writer.setMinVersion(reader.version());
  const std::string cpu("X\x03\0\0\0cpu", 8);
  const std::string cuda("X\x06\0\0\0cuda:0", 11);
  int relocated = 0;
  for (const std::string& name : reader.getAllRecords()) {
    if (name == "version" || name.rfind(".data/", 0) == 0)
      continue;  // written by writeEndOfFile
    auto [ptr, size] = reader.getRecord(name);
    std::string bytes(static_cast<const char*>(ptr.get()), size);
    if (name.size() >= 8 && name.compare(name.size() - 8, 8, "data.pkl") == 0) {
      for (size_t at = bytes.find(cpu); at != std::string::npos;
           at = bytes.find(cpu, at + cuda.size())) {
        bytes.replace(at, cpu.size(), cuda);
        ++relocated;
      }
    }
    writer.writeRecord(name, bytes.data(), bytes.size());
  }
  writer.writeEndOfFile();
  EXPECT_GT(relocated, 0) << "no storage location found to rewrite";
  return out;
}

// A checkpoint written by a GPU rank resumes on this rank's device (here the
// CPU): its optimizer state (SGD momentum, saved on cuda:0) is loaded onto
// the placement's device, and the run continues exactly as the
// uninterrupted one. Before, the state was loaded where it was saved, so
// this resume failed (and on a node every local rank >= 1 got cuda:0's).
TEST(Checkpoint, GpuWrittenCheckpointResumesOnThisRanksDevice) {
  SharedDir dir("ondevice");
  make_features(dir, "train.h5", 200);
  const TrainConfig full = ckpt_config(dir, "full");
  const RunResult a = train_out(full, MPI_COMM_WORLD).run;
  TrainConfig part = ckpt_config(dir, "part");
  part.training.max_windows = 5;  // a checkpoint at step 5
  const RunResult first = train_out(part, MPI_COMM_WORLD).run;
  const std::string path = checkpoint_path(part.output.dir, 5);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    Checkpoint c = load_checkpoint(path);
    ASSERT_FALSE(c.optimizer.empty());
    c.optimizer = as_written_on_cuda0(c.optimizer);
    save_checkpoint(path, c);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  part.training.max_windows = 0;
  const Resumed second = train_out(part, MPI_COMM_WORLD, path);
  expect_continues_exactly(a, first, second.run);
}

TEST(Checkpoint, ResumesAtAnotherWorldSize) {
  SharedDir dir("reshard");
  make_features(dir, "train.h5", 256);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // A one-rank run (on every rank, each in its own folder) stops after 6
  // windows of 16; the job's W ranks continue from rank 0's checkpoint.
  TrainConfig one = ckpt_config(dir, "self" + std::to_string(rank));
  one.model.dropout = 0.0;  // other ranks draw other masks
  one.training.effective_batch_size = 16;
  one.data.batch_size = 4;
  one.training.epochs = 2;
  const RunResult whole = train_out(one, MPI_COMM_SELF).run;
  one.training.max_windows = 6;
  one.output.dir = dir.file("stop" + std::to_string(rank));
  train_out(one, MPI_COMM_SELF);
  MPI_Barrier(MPI_COMM_WORLD);

  TrainConfig many = one;
  many.training.max_windows = 0;
  many.output.dir = dir.file("many");
  const Resumed r =
      train_out(many, MPI_COMM_WORLD, checkpoint_path(dir.file("stop0"), 6));
  EXPECT_EQ(r.run.summary.window_results.front().step, 7);
  EXPECT_LT(max_abs_diff(r.run.params, whole.params), 1e-5);
}

TEST(Checkpoint, CorruptAndForeignCheckpointsAreRefused) {
  SharedDir dir("refuse");
  make_features(dir, "train.h5", 100);
  TrainConfig c = ckpt_config(dir, "out");
  c.training.epochs = 2;
  train_out(c, MPI_COMM_WORLD);
  const auto files = list_checkpoints(c.output.dir);
  ASSERT_GE(files.size(), 2u);
  const std::string metrics_before = slurp(c.output.dir + "/metrics.jsonl");
  MPI_Barrier(MPI_COMM_WORLD);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {  // truncate the newest by hand
    std::filesystem::resize_file(
        files[0], std::filesystem::file_size(files[0]) / 2);
  }
  MPI_Barrier(MPI_COMM_WORLD);

  MpiCommunicator comm(MPI_COMM_WORLD);
  {
    Trainer t(c, comm, Trainer::Options{});
    t.prepare();
    try {
      t.resume(files[0]);
      ADD_FAILURE() << "a truncated checkpoint was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(files[0]), std::string::npos);
    }
    // auto falls back to the older one and says so.
    const std::string note = t.resume("auto");
    EXPECT_NE(note.find(files[1]), std::string::npos) << note;
    EXPECT_NE(note.find("skipped"), std::string::npos) << note;
  }
  TrainConfig other = c;
  other.model.depth = 3;
  {
    Trainer t(other, comm, Trainer::Options{});
    t.prepare();
    try {
      t.resume(files[1]);
      ADD_FAILURE() << "a checkpoint of another shape was accepted";
    } catch (const Error& e) {
      EXPECT_NE(
          std::string(e.what()).find("parameter tensors"), std::string::npos)
          << e.what();
    }
  }
  // Nothing was overwritten by the refusals.
  EXPECT_EQ(slurp(c.output.dir + "/metrics.jsonl"), metrics_before);
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace memtrain

namespace memtrain {
namespace {

// A stop request that lands on an epoch's last window: the checkpoint comes
// first and no validation runs (a whole-volume validation could outlast the
// grace time); the checkpoint's position is the epoch's end, so the resumed
// run validates that epoch first and completes the uninterrupted run
// exactly.
// A run of one window per epoch, validated, in `dir` (its files made).
TrainConfig one_window_epochs(const SharedDir& dir) {
  make_features(dir, "train.h5", 96);
  make_features(dir, "val.h5", 32);
  TrainConfig c = ckpt_config(dir, "full");
  c.data.val = dir.file("val.h5");
  c.training.effective_batch_size = 96;
  c.data.batch_size = 96;
  return c;
}

TEST(Checkpoint, StopOnAnEpochsLastWindowCheckpointsBeforeValidation) {
  SharedDir dir("stop_last");
  const TrainConfig full = one_window_epochs(dir);
  const RunResult a = train_out(full, MPI_COMM_WORLD).run;

  TrainConfig part = full;
  part.output.dir = dir.file("part");
  request_stop(SIGTERM);  // seen at the first window's boundary
  const RunResult first = train_out(part, MPI_COMM_WORLD).run;
  request_stop(0);
  EXPECT_TRUE(first.summary.stopped);
  EXPECT_EQ(first.summary.windows, 1);
  EXPECT_EQ(first.summary.validations.size(), 0u) << "validated before "
                                                     "stopping";
  const auto files = list_checkpoints(part.output.dir);
  ASSERT_EQ(files.size(), 1u);
  const Checkpoint ck = load_checkpoint(files[0]);
  EXPECT_EQ(ck.state.step, 1);
  EXPECT_EQ(ck.state.epoch, 0);  // still epoch 0: its end is to come
  EXPECT_EQ(ck.state.epoch_samples, 96);
  const Resumed second = train_out(part, MPI_COMM_WORLD, "auto");
  ASSERT_EQ(
      second.run.summary.validations.size(), a.summary.validations.size());
  for (size_t i = 0; i < a.summary.validations.size(); ++i) {
    EXPECT_EQ(second.run.summary.validations[i].epoch, int64_t(i));
    EXPECT_EQ(
        second.run.summary.validations[i].loss, a.summary.validations[i].loss);
  }
  EXPECT_EQ(max_abs_diff(second.run.params, a.params), 0.0);
  // The epoch records read as the uninterrupted run's (train loss of epoch
  // 1 carried through the checkpoint).
  auto epoch_losses = [](const std::string& path) {
    std::vector<std::string> out;
    std::ifstream in(path);
    for (std::string l; std::getline(in, l);) {
      if (l.find("\"type\":\"epoch\"") != std::string::npos)
        out.push_back(l.substr(l.find("\"train_loss\"")).substr(0, 40));
    }
    return out;
  };
  EXPECT_EQ(
      epoch_losses(part.output.dir + "/metrics.jsonl"),
      epoch_losses(full.output.dir + "/metrics.jsonl"));
}

// The same on the last epoch's last window, where no window is left: the
// resumed run still owes that epoch its validation and its record.
TEST(Checkpoint, StopOnTheLastWindowOfTheRunValidatesOnResume) {
  SharedDir dir("stop_final");
  TrainConfig full = one_window_epochs(dir);
  full.training.epochs = 1;  // the first window is the run's last
  const RunResult a = train_out(full, MPI_COMM_WORLD).run;
  ASSERT_EQ(a.summary.validations.size(), 1u);

  TrainConfig part = full;
  part.output.dir = dir.file("part");
  request_stop(SIGTERM);
  const RunResult first = train_out(part, MPI_COMM_WORLD).run;
  request_stop(0);
  EXPECT_TRUE(first.summary.stopped);
  EXPECT_EQ(first.summary.validations.size(), 0u);
  const Resumed second = train_out(part, MPI_COMM_WORLD, "auto");
  ASSERT_EQ(second.run.summary.validations.size(), 1u)
      << "the resumed run skipped the last epoch's validation";
  EXPECT_EQ(second.run.summary.validations[0].epoch, 0);
  EXPECT_EQ(
      second.run.summary.validations[0].loss, a.summary.validations[0].loss);
  EXPECT_EQ(max_abs_diff(second.run.params, a.params), 0.0);
  int epochs = 0;
  std::ifstream in(part.output.dir + "/metrics.jsonl");
  for (std::string l; std::getline(in, l);)
    epochs += l.find("\"type\":\"epoch\"") != std::string::npos;
  EXPECT_EQ(epochs, 1) << "the epoch's record";
}

// Pruning after writing step 4: later steps (another timeline) go, and of
// the rest only the newest `keep` stay.
TEST(Checkpoint, PruneKeepsNewestUpToTheCurrentStep) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0)
    return;
  test::TempDir dir("prune");
  std::filesystem::create_directories(dir.file("checkpoints"));
  for (int s = 1; s <= 6; ++s)
    std::ofstream(checkpoint_path(dir.path(), s));
  prune_checkpoints(dir.path(), 2, 4);
  EXPECT_EQ(
      list_checkpoints(dir.path()),
      (std::vector<std::string>{
          checkpoint_path(dir.path(), 4), checkpoint_path(dir.path(), 3)}));
}

}  // namespace
}  // namespace memtrain
