#pragma once
// The safetensors format (https://huggingface.co/docs/safetensors): an 8-byte
// little-endian header length, a JSON header mapping each name to dtype,
// shape and byte offsets, then the raw little-endian tensor bytes. memtrain
// writes model.safetensors with it; any safetensors reader loads the file.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace memtrain {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Writes `tensors` (host or device; float32, float64, float16, bfloat16,
// int64, int32, uint8) and string `metadata` to `path` atomically. Throws
// memtrain::Error on I/O failure or a repeated name.
void save_safetensors(
    const std::string& path,
    const NamedTensors& tensors,
    const std::map<std::string, std::string>& metadata = {});

// Reads every tensor of a safetensors file onto the host, in file order.
// Throws memtrain::Error naming the file and what is wrong.
NamedTensors load_safetensors(
    const std::string& path,
    std::map<std::string, std::string>* metadata = nullptr);

}  // namespace memtrain
