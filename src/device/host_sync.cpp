#include "memtrain/device/host_sync.h"

#include <torch/torch.h>

#include <ATen/record_function.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "memtrain/memory/device_memory.h"
#include "memtrain/util/error.h"

namespace memtrain {

// Note [One host read per window]
// A host read of a device value (loss.item(), isfinite(x).all().item(), a
// norm read to compare it) makes the host wait until the device has run
// everything queued before it: the host then has nothing queued ahead, and
// the device idles while the host launches the next kernels. On a CPU the
// wait costs nothing; on a GPU it costs the launch lead every time. So the
// window keeps what it learns on the device -- each micro-step's loss is
// added to a device sum, the gradient's and the scaler's inf/NaN checks
// set a device flag (flag_nonfinite), clipping scales by a device factor
// -- and the host reads it once, at the boundary, with the totals the
// all-reduce brought (window.cpp). A window has exactly two host syncs,
// whatever its accumulation steps (metrics.jsonl's host_syncs; pinned by
// trainer_semantics_test):
//   1. the totals read after the all-reduce: loss sum, samples, stop
//      requests, every rank's memory figures, and the non-finite flag. The
//      host must learn them before it decides whether to step, and the
//      sum over ranks exists only once the all-reduce ran;
//   2. the wait at the window's end (DeviceClock::finish()): the window's
//      optimizer step and whatever else it queued are done, so that its
//      times and memory figures are the window's own and the next window
//      starts from an idle device (Note [Window clock] in placement.h).
// Both are counted on the CPU too, where they cost nothing, so that the
// CPU's tests pin the GPU's count. Every device-to-host read of the loop
// goes through read_to_host(), every wait is a HostSync span; a bare
// .item() anywhere a window runs -- the loop, a task, a model, the input
// path -- is a bug, which the dispatcher sees (Note [Host reads seen by
// the dispatcher]). Host waits for a collective on a GPU (NCCL's wait(),
// which the window's gradient sync does not use) are counted too. Reads
// outside the window loop (the planner's probes, validation, checkpoints)
// belong to no window.

// Note [Host reads seen by the dispatcher]
// The count above is kept by the code that syncs, so a read that does not
// go through it -- a bare .item() in a task, a model or the input path --
// would not change it. HostReadWatch counts from the other side: every
// operator call of the window's thread passes LibTorch's RecordFunction
// dispatcher hooks, and a thread-local callback sees each HostSync span
// begin (a user scope "memtrain::host_sync") and each host read outside
// one: aten::_local_scalar_dense (item(), bool(t), equal(), ...) and, where
// LibTorch has CUDA, aten::copy_ from a device into host memory (.cpu(),
// .to(kCPU)). The window loop makes one per window when
// MEMTRAIN_WATCH_HOST_READS asks for it (the test suite sets strict), so
// every test that trains checks that the dispatcher saw exactly the
// window's own syncs. What it cannot see: a read of a CPU tensor's memory
// (data_ptr(), an accessor), which is no sync; on the CPU build, a .cpu()
// of a CPU tensor, which a CUDA build would run as a copy (it counts
// where LibTorch has CUDA); and calls on other threads (autograd's device
// threads on a GPU, the loader's readers): the watch is the window
// thread's.

namespace {

std::atomic<int64_t> g_host_syncs{0};

// A float is inf or NaN iff its exponent bits are all ones. Blocks of a
// fixed size with no early exit inside let the compiler vectorise the test
// (one branch per block): 8 ms instead of 14-25 ms for the 17 M gradients
// of benchmarks/vs_pytorch's MLP, every window.
bool host_all_finite(const float* p, int64_t n) {
  constexpr int64_t kBlock = 1024;
  uint32_t bits[kBlock];
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    std::memcpy(bits, p + i, sizeof(bits));
    uint32_t bad = 0;
    for (int64_t k = 0; k < kBlock; ++k)
      bad |= static_cast<uint32_t>((bits[k] & 0x7f800000u) == 0x7f800000u);
    if (bad)
      return false;
  }
  for (; i < n; ++i) {
    if (!std::isfinite(p[i]))
      return false;
  }
  return true;
}

}  // namespace

int64_t host_syncs() {
  return g_host_syncs.load(std::memory_order_relaxed);
}

constexpr const char* kHostSyncScope = "memtrain::host_sync";

HostSync::HostSync() {
  g_host_syncs.fetch_add(1, std::memory_order_relaxed);
  auto scope =
      std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (scope->isActive()) {
    scope->before(kHostSyncScope);
    scope_ = std::move(scope);
  }
}

HostSync::~HostSync() = default;  // ends the scope

struct HostReadWatch::State {
  at::CallbackHandle handle = 0;
  int64_t depth = 0;  // HostSync spans open
  int64_t seen = 0;
  std::string bare;
};

namespace {

thread_local HostReadWatch::State* t_watch = nullptr;

bool is_host_sync(const at::RecordFunction& fn) {
  return fn.scope() == at::RecordScope::USER_SCOPE && fn.name() != nullptr &&
         std::strcmp(fn.name(), kHostSyncScope) == 0;
}

// "aten::_local_scalar_dense(cuda:0)", "aten::copy_(cuda:0 -> cpu)", or ""
// when `fn` reads nothing to the host.
std::string host_read(const at::RecordFunction& fn) {
  const char* name = fn.name();
  if (name == nullptr)
    return "";
  const auto device = [](const c10::IValue& v) {
    return v.isTensor() && v.toTensor().defined() ? v.toTensor().device().str()
                                                  : std::string("?");
  };
  // Its device where the inputs are boxed.
  if (std::strcmp(name, "aten::_local_scalar_dense") == 0)
    return fn.inputs().empty()
               ? std::string(name)
               : std::string(name) + "(" + device(fn.inputs()[0]) + ")";
  if (std::strcmp(name, "aten::copy_") == 0 && fn.inputs().size() >= 2) {
    const c10::IValue& dst = fn.inputs()[0];
    const c10::IValue& src = fn.inputs()[1];
    if (dst.isTensor() && src.isTensor() && dst.toTensor().is_cpu() &&
        !src.toTensor().is_cpu())
      return std::string(name) + "(" + device(src) + " -> cpu)";
  }
  return "";
}

std::unique_ptr<at::ObserverContext> watch_start(const at::RecordFunction& fn) {
  HostReadWatch::State* w = t_watch;
  if (w == nullptr)
    return nullptr;
  if (is_host_sync(fn)) {
    ++w->depth;
    ++w->seen;
  } else if (w->depth == 0) {
    const std::string read = host_read(fn);
    if (!read.empty()) {
      ++w->seen;
      w->bare += (w->bare.empty() ? "" : ", ") + read;
    }
  }
  return nullptr;
}

void watch_end(const at::RecordFunction& fn, at::ObserverContext*) {
  HostReadWatch::State* w = t_watch;
  if (w != nullptr && w->depth > 0 && is_host_sync(fn))
    --w->depth;
}

}  // namespace

HostReadWatch::HostReadWatch(bool on) {
  if (!on)
    return;
  MT_CHECK(
      t_watch == nullptr,
      "HostReadWatch: one at a time on a thread (an internal error)");
  state_ = std::make_unique<State>();
  t_watch = state_.get();
  // A copy's devices are inputs; boxing every call's inputs costs time, so
  // only where LibTorch can have a device to copy from.
  state_->handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(watch_start, watch_end)
          .needsInputs(at::hasCUDA())
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
}

HostReadWatch::~HostReadWatch() {
  if (!state_)
    return;
  at::removeCallback(state_->handle);
  t_watch = nullptr;
}

int64_t HostReadWatch::seen() const {
  return state_ ? state_->seen : 0;
}

std::string HostReadWatch::bare() const {
  return state_ ? state_->bare : std::string();
}

HostReadWatching host_read_watching() {
  const char* v = std::getenv("MEMTRAIN_WATCH_HOST_READS");
  const std::string s = v == nullptr ? "" : v;
  if (s.empty() || s == "0")
    return HostReadWatching::kOff;
  if (s == "1")
    return HostReadWatching::kRecord;
  MT_CHECK(
      s == "strict",
      "MEMTRAIN_WATCH_HOST_READS=\"",
      s,
      "\" is not one of 0, 1, strict: unset it, or 1 to record what the "
      "dispatcher sees of each window's host reads, strict to stop at a "
      "bare one");
  return HostReadWatching::kStrict;
}

std::vector<double> read_to_host(const at::Tensor& t, const DeviceWait& wait) {
  const HostSync sync;
  at::Tensor h;
  {
    memory::HostScope host;
    const at::Tensor src = t.detach().reshape({-1}).to(at::kDouble);
    if (src.device().is_cpu()) {
      h = src;  // 1-D: contiguous
    } else {
      // Behind the current stream's work, then an event: the host's wait
      // is on that event, through `wait` (a watched wait) or polling.
      h = at::empty(
          {src.numel()}, src.options().device(c10::kCPU).pinned_memory(true));
      h.copy_(src, /*non_blocking=*/true);
      const c10::DeviceType type = src.device().type();
      c10::Event copied(type);
      copied.record(c10::impl::VirtualGuardImpl(type).getStream(src.device()));
      const std::function<bool()> done = [&copied] { return copied.query(); };
      if (wait) {
        wait(done);
      } else {
        while (!done())
          std::this_thread::yield();
      }
    }
  }
  const double* p = h.data_ptr<double>();
  return std::vector<double>(p, p + h.numel());
}

void flag_nonfinite(
    const std::vector<at::Tensor>& tensors,
    double inv_scale,
    const at::Tensor& found) {
  if (tensors.empty())
    return;
  torch::NoGradGuard no_grad;
  if (tensors.front().is_cuda()) {
    const at::Tensor inv = torch::full({1}, inv_scale, found.options());
    at::Tensor flag = found;  // the same storage
    at::_amp_foreach_non_finite_check_and_unscale_(tensors, flag, inv);
    return;
  }
  // CPU: LibTorch 1.13 has the fused kernel for CUDA only. Without
  // allocating: a mask the size of the gradient (isfinite) would raise the
  // step's peak memory. A dense tensor in any dimension order (a
  // channels-last gradient) is scanned where it lies.
  bool finite = true;
  for (const auto& t : tensors) {
    MT_INTERNAL_ASSERT(t.scalar_type() == at::kFloat);
    const at::Tensor c = t.is_non_overlapping_and_dense() ? t : t.contiguous();
    if (finite && !host_all_finite(c.data_ptr<float>(), c.numel()))
      finite = false;
    if (inv_scale != 1.0)
      at::Tensor(t).mul_(inv_scale);
  }
  if (!finite)
    found.add_(1.0);
}

}  // namespace memtrain
