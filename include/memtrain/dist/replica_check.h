#pragma once
// Replica check: do all ranks hold bit-identical parameters? A 64-bit
// FNV-1a hash of every parameter's bytes, compared with rank 0's.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace memtrain {

class Communicator;

// Hash of the tensors' bytes, in order (host tensors).
uint64_t parameter_checksum(const std::vector<at::Tensor>& tensors);

// Collective: true on every rank iff every rank's checksum equals rank 0's.
// `checksum` receives this rank's.
bool replicas_identical(
    Communicator& comm,
    const std::vector<at::Tensor>& tensors,
    uint64_t* checksum);

}  // namespace memtrain
