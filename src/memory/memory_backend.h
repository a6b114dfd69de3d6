#pragma once
// Private: the implementations behind device_memory.h. One is active per
// process; the free functions of device_memory.h call it.

#include <string>

#include "memtrain/memory/device_memory.h"

namespace memtrain::memory {

class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  virtual std::string name() const = 0;
  virtual Stats stats() = 0;
  virtual void reset_peak() = 0;
  virtual int64_t release_cache() = 0;
  virtual void set_cap(int64_t bytes) = 0;
  virtual std::string write_snapshot(const std::string& dir) = 0;
  // -1: the backend cannot say (device_memory.h).
  virtual int64_t device_used_bytes() {
    return -1;
  }
  virtual int64_t measure_outside() {
    return 0;
  }
};

// Makes `backend` (never freed: tensors may outlive static destruction) the
// active one. The first call wins; a second with another backend is an
// internal error (one device per process).
void activate_backend(MemoryBackend* backend);

// The CPU accounting allocator as a backend (accounting_allocator.cpp).
MemoryBackend* cpu_accounting_backend();

}  // namespace memtrain::memory
