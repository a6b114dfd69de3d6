#include <algorithm>
#include <cmath>

#include "memtrain/config/train_config.h"
#include "memtrain/util/error.h"

namespace memtrain {

// The rules between keys (a key's own range or choices is its row's check,
// keys.def); the rules that depend on the model are its registry's
// (model/registry.cpp: check_model_config).
void TrainConfig::validate() const {
  MT_CHECK(
      training.min_lr <= training.lr,
      "config: training.min_lr = ",
      training.min_lr,
      " is above training.lr = ",
      training.lr,
      "; the decay ends at min_lr, so set it below lr");
  MT_CHECK(
      !data.train.empty(),
      "config: data.train is empty; set it to a training HDF5 file "
      "(memtrain make-data makes one)");
  MT_CHECK(!output.dir.empty(), "config: output.dir is empty; set a folder");
  MT_CHECK(
      model.pretrained_rename.empty() || !model.pretrained.empty(),
      "config: model.pretrained_rename is set but model.pretrained is not; "
      "set the weights file or drop the rules");
  MT_CHECK(
      std::none_of(
          output.dir.begin(),
          output.dir.end(),
          [](char c) { return static_cast<unsigned char>(c) < 0x20; }),
      "config: output.dir = '",
      output.dir,
      "' holds a control character (a newline or tab?): the run's files and "
      "plots name it in logs and scripts; choose a folder name without one");
  MT_CHECK(
      data.batch_size != kAuto || training.effective_batch_size > 0,
      "config: data.batch_size=auto needs training.effective_batch_size "
      "(the samples per optimizer step the planner must reach)");
  if (memory.host_budget != "auto") {
    try {
      (void)parse_memory_size(memory.host_budget);
    } catch (const Error& e) {
      throw Error(detail::concat(
          "config: memory.host_budget = '",
          memory.host_budget,
          "': ",
          e.what(),
          "; or auto (the job's memory less a margin, over its ranks on "
          "the node)"));
    }
  }
  MT_CHECK(
      data.batch_size != kAuto || memory.budget.limited(),
      "config: data.batch_size=auto needs memory.budget (what the "
      "micro-batch must fit in), e.g. --memory.budget=v100-16gb");
  MT_CHECK(
      training.effective_batch_size == 0 ||
          training.gradient_accumulation_steps == 1,
      "config: set training.effective_batch_size or "
      "training.gradient_accumulation_steps, not both (the steps follow "
      "from the effective batch)");
  MT_CHECK(
      MEMTRAIN_CUDA || training.amp != Amp::kFp16,
      "config: training.amp=fp16 needs a CUDA build (fp16 autocast runs "
      "on CUDA devices); on this CPU build use training.amp=bf16");
  const bool episodic = data.episodes.n_way > 0;
  MT_CHECK(
      episodic == (model.head != Head::kLinear),
      "config: data.episodes.n_way=",
      data.episodes.n_way,
      " with model.head=",
      model.head,
      ": episodes need a few-shot head and a few-shot head needs episodes; "
      "set model.head=prototype, cosine or cosine_transformer with "
      "data.episodes.n_way >= 2, or "
      "model.head=linear with data.episodes.n_way=0");
  // The rules that depend on the model are its registry's
  // (model/registry.h: check_model_config).
  MT_CHECK(
      training.cudnn_benchmark != Switch::kOn || !training.deterministic,
      "config: training.cudnn_benchmark=on picks cuDNN's algorithms by "
      "timing them, which training.deterministic=true rules out; set "
      "training.cudnn_benchmark=auto (off when deterministic) or "
      "training.deterministic=false");
  MT_CHECK(
      !model.sync_bn || !episodic,
      "config: model.sync_bn: true is for row windows; few-shot episodes "
      "(data.episodes.n_way > 0) train with each micro-batch's own "
      "batch-norm statistics: set model.sync_bn=false");
  MT_CHECK(
      !episodic || data.episodes.n_way >= 2,
      "config: data.episodes.n_way=1: an episode needs at least 2 classes");
  // Which metrics a run reports is the task's to say (Note [Tasks]); the
  // run checks the key against them when it starts. Here: the shape.
  const std::string& best = validation.best_metric;
  MT_CHECK(
      best == "auto" || best == "none" ||
          (best.rfind("val_", 0) == 0 && best.size() > 4 &&
           std::all_of(
               best.begin(),
               best.end(),
               [](char c) {
                 return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                        c == '_';
               })),
      "config: validation.best_metric = '",
      best,
      "' is not a metric's key: give auto, none, val_loss or a metric of the "
      "run's task (val_dice, val_accuracy, val_auc, val_mae, ...)");
  MT_CHECK(
      training.optimizer == Optimizer::kSgd || training.momentum == 0.0 ||
          training.momentum == TrainingConfig{}.momentum,
      "config: training.momentum = ",
      training.momentum,
      " applies to training.optimizer=sgd only, but the optimizer is '",
      training.optimizer,
      "'; remove training.momentum");
}

}  // namespace memtrain
