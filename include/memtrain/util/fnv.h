#pragma once

#include <cstddef>
#include <cstdint>

namespace memtrain {

// FNV-1a, 64 bits: the one hash memtrain uses where a digest needs no
// cryptographic strength (checkpoint checksums, replica checks, the build
// and data-file identities compared across ranks). Start from kFnvOffset
// and feed bytes in order.
constexpr uint64_t kFnvOffset = 14695981039346656037ull;

inline uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i)
    h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace memtrain
