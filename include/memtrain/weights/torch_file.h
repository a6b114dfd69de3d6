#pragma once
// Weights saved by PyTorch's torch.save (.pt, .pth, .bin): the zip format
// PyTorch writes since 1.6 (a pickle, data.pkl, whose tensors point at
// storages stored beside it as data/<key>). memtrain reads the state dict
// in it, the form users have (MONAI's and timm's checkpoints,
// `torch.save(model.state_dict(), F)`), without Python and without
// executing anything: the pickle is read by a restricted reader that knows
// PyTorch's tensor and storage constructors and keeps every other object
// as an inert placeholder. Note [Reading torch.save files] in
// ARCHITECTURE.md.

#include <string>

#include "memtrain/weights/safetensors.h"

namespace memtrain {

// A state dict found in a torch.save file.
struct TorchWeights {
  NamedTensors tensors;  // in the file's order, on the host, in its dtype
  // Where it was: "" when the file's object is the state dict itself, else
  // the key of the top-level dict that holds it ("state_dict", "model",
  // ...: a training checkpoint).
  std::string entry;
};

// True when `path` starts as a torch.save file does: a zip archive
// (PyTorch >= 1.6) or the legacy format's magic number (refused by
// load_torch_weights with the command that converts it). Safetensors files
// start with their header's length.
bool is_torch_file(const std::string& path);

// Reads the state dict of the torch.save file `path`. Throws memtrain::Error
// naming the file and what is wrong: not a torch.save zip (or the legacy
// format of PyTorch < 1.6, with the command that converts it), a
// TorchScript archive, a pickled module rather than its state_dict(), no
// dict of tensors at the top or under a known key (the keys it has are
// named; a preferred key whose dict is not one of tensors is named with
// the value that is not a tensor), a tensor of a kind memtrain cannot hold
// (quantized, complex, sparse), a storage missing or of the wrong size, a
// truncated or overflowing pickle. Nothing else escapes (a c10::Error of the
// zip reader, an allocation failure: memtrain::Error naming the file).
// Non-tensor module extra states ("*_extra_state") are skipped.
TorchWeights load_torch_weights(const std::string& path);

}  // namespace memtrain
