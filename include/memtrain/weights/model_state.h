#pragma once
// A model's weights by name: its parameters and buffers in PyTorch's
// state-dict order, loading them from a safetensors or torch.save file by
// name (renamed by rules where the file's names differ) with a
// report of what did not match, freezing parameters by name prefix, and
// keeping buffers (batch-norm running statistics) equal on every rank.
//
// model.safetensors, best.safetensors, initial.safetensors, checkpoints'
// "model/<name>" tensors and `memtrain export` hold state_tensors(): for a
// model without buffers (mlp, cnn, unet3d, dual_encoder, the few-shot
// heads) exactly its named parameters, as before buffers were saved; for
// the ResNets also running_mean, running_var and num_batches_tracked
// (int64), as PyTorch's state_dict() has them.

#include <torch/torch.h>

#include <string>
#include <vector>

#include "memtrain/weights/safetensors.h"
#include "memtrain/weights/torch_file.h"

namespace memtrain {

class Communicator;

// The model's parameters and buffers (the live tensors, not copies) in
// PyTorch's state_dict() order: a module's own parameters, then its own
// buffers, then each child's, depth first in registration order.
NamedTensors state_tensors(const torch::nn::Module& model);

// What loading a file by name found.
struct LoadReport {
  std::string path;
  // Where in a torch.save file the state dict was ("" for the file's own
  // object or a safetensors file; "state_dict", "model": a checkpoint's).
  std::string entry;
  int64_t renamed = 0;        // file names changed by the rename rules
  int64_t model_tensors = 0;  // in state_tensors()
  std::vector<std::string> loaded;
  std::vector<std::string> missing;     // in the model, not in the file
  std::vector<std::string> unexpected;  // in the file, not in the model
  struct Mismatch {
    std::string name;
    std::vector<int64_t> file, model;
  };
  std::vector<Mismatch> mismatched;  // both, of other shapes
  // num_batches_tracked counters the file lacks (not counted as missing:
  // with a momentum, as here, batch-norm never reads them; PyTorch's
  // BatchNorm loads such files too). They keep their values.
  std::vector<std::string> counters_absent;

  bool complete() const {
    return missing.empty() && unexpected.empty() && mismatched.empty();
  }
  // One line per category with counts and the first few names:
  //   "<what>: FILE: 318 of 320 tensors loaded"
  //   "<what>: FILE ('state_dict'): ..." (a checkpoint's state dict)
  //   "<what>: 150 of 170 names renamed by model.pretrained_rename"
  //   "<what>: 2 missing (in the model, not in the file): fc.weight, ..."
  //   "<what>: 1 unexpected (in the file, not in the model): ..."
  //   "<what>: 2 shape-mismatched (file vs model): fc.weight [1000, 2048]
  //    vs [4, 2048], ..."
  std::vector<std::string> lines(const std::string& what) const;
};

// Copies every tensor of `file` whose name and shape match one of the
// model's (state_tensors) into it (converted to the model's dtype and
// device), and reports the rest. With `strict`, nothing is copied unless
// the file matches completely; otherwise throws memtrain::Error naming
// `what` (e.g. "model.pretrained"), the file, and the keys that differ,
// with a hint when only the model's head (its last module) differs.
// `head` names that module ("fc", "head") for the hint ("" for none).
LoadReport load_state(
    torch::nn::Module& model,
    const NamedTensors& file,
    const std::string& path,
    bool strict,
    const std::string& what,
    const std::string& head);

// model.pretrained_rename: rules "REGEX -> REPLACEMENT" (ECMAScript regex,
// $1.. in the replacement), applied in order to every name of the file,
// each replacing all its matches (std::regex_replace). Throws
// memtrain::Error naming a rule without " -> " or with a bad regex, a rule
// that matches no name (with a few of the names), and two names renamed
// alike. Returns the count of names changed.
int64_t rename_tensors(
    NamedTensors& tensors, const std::vector<std::string>& rules);

// Reads `path` (safetensors, or a torch.save file: torch_file.h) and
// renames its tensors by `rename` (rename_tensors; *renamed: how many). A
// file that cannot be read is a memtrain::Error naming `what` and the file.
TorchWeights read_weights_file(
    const std::string& path,
    const std::string& what,
    const std::vector<std::string>& rename,
    int64_t* renamed);

// Reads `path` and renames its tensors by `rename` (read_weights_file),
// then load_state()s them.
LoadReport load_weights_file(
    torch::nn::Module& model,
    const std::string& path,
    bool strict,
    const std::string& what,
    const std::vector<std::string>& rename = {});

// model.freeze: every parameter whose name is a prefix p, starts with
// "p.", or (p ending in '.') starts with p stops requiring a gradient.
// Returns the frozen parameters' names. Throws memtrain::Error naming each
// prefix that matches no parameter (and a few parameter names).
std::vector<std::string> freeze_parameters(
    torch::nn::Module& model, const std::vector<std::string>& prefixes);

// Collective (broadcasts, none for a model without buffers or one rank):
// every rank's buffers become rank 0's. Buffers are computed per rank
// (batch-norm statistics of its own micro-batches), as in PyTorch DDP,
// which broadcasts rank 0's before each forward; here that happens where
// they are read or saved (validation, checkpoints, the weights files), so
// what is saved and validated is rank 0's, as with DDP.
void broadcast_buffers(Communicator& comm, const std::vector<at::Tensor>& bufs);

}  // namespace memtrain
