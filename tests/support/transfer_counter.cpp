#include "transfer_counter.h"

#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>

#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "memtrain/compat.h"

namespace memtrain::test {
namespace {

std::mutex g_mutex;
int64_t g_count = 0;
std::string g_calls;
bool g_alive = false;
at::CallbackHandle g_handle = 0;

std::string device_of(const c10::IValue& v) {
  return v.isTensor() && v.toTensor().defined() ? v.toTensor().device().str()
                                                : "?";
}

// The call as counted ("aten::to(cpu -> cpu)"), or "" when it crosses
// nothing.
std::string crossing(const at::RecordFunction& fn) {
  const char* name = fn.name();
  if (name == nullptr)
    return "";
  const auto inputs = fn.inputs();
  if (std::strcmp(name, "aten::_local_scalar_dense") == 0)
    return std::string(name) + "(" +
           (inputs.empty() ? "?" : device_of(inputs[0])) + ")";
  if (std::strcmp(name, "aten::to") == 0) {
    // The device asked for and whether a dtype is too: to.device(self,
    // device, dtype, ...) always names one; to.dtype_layout(self, dtype?,
    // layout?, device?, ...) does unless it is a plain move (LibTorch 2.x
    // may hand its keyword-only arguments over apart).
    const c10::IValue* device = nullptr;
    bool dtype = true;
    for (size_t i = 0; i < inputs.size() && device == nullptr; ++i) {
      if (inputs[i].isDevice()) {
        device = &inputs[i];
        if (i == 3)
          dtype = !inputs[1].isNone();
      }
    }
#if MEMTRAIN_TORCH_AT_LEAST(2, 0)
    const auto kw = fn.kwinputs();
    const auto d = kw.find("device");
    if (device == nullptr && d != kw.end() && d->second.isDevice()) {
      device = &d->second;
      const auto t = kw.find("dtype");
      dtype = t != kw.end() && !t->second.isNone();
    }
#endif
    if (device == nullptr || inputs.empty())
      return "";
    const std::string from = device_of(inputs[0]),
                      to = device->toDevice().str();
    // A move to another device; or, where both are one (the CPU build), a
    // plain move, which a CUDA build runs as a copy. A dtype conversion
    // that names its own device (toType: softmax's dtype) is neither.
    if (from != to || !dtype)
      return std::string(name) + "(" + from + " -> " + to + ")";
    return "";
  }
  if (std::strcmp(name, "aten::copy_") == 0 && inputs.size() >= 2 &&
      inputs[0].isTensor() && inputs[1].isTensor() &&
      inputs[0].toTensor().device() != inputs[1].toTensor().device())
    return std::string(name) + "(" + device_of(inputs[1]) + " -> " +
           device_of(inputs[0]) + ")";
  return "";
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  const std::string what = crossing(fn);
  if (!what.empty()) {
    std::lock_guard<std::mutex> lock(g_mutex);
    ++g_count;
    if (!g_calls.empty())
      g_calls += ", ";
    g_calls += what;
  }
  return nullptr;
}

}  // namespace

TransferCounter::TransferCounter() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_alive)
    throw std::logic_error("TransferCounter: one at a time");
  g_alive = true;
  g_count = 0;
  g_calls.clear();
  g_handle = at::addGlobalCallback(
      at::RecordFunctionCallback(on_start).needsInputs(true).scopes(
          {at::RecordScope::FUNCTION}));
}

TransferCounter::~TransferCounter() {
  at::removeCallback(g_handle);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_alive = false;
}

int64_t TransferCounter::count() const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_count;
}

std::string TransferCounter::calls() const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_calls;
}

}  // namespace memtrain::test
