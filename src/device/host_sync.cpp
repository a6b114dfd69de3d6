#include "memtrain/device/host_sync.h"

#include <torch/torch.h>

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <atomic>
#include <cmath>
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
// goes through read_to_host(); a bare .item() in src/train/loop,
// src/train/tasks' accumulate() or src/dist is a bug (ARCHITECTURE.md's
// Note [One host read per window] has the grep that finds them). Host
// waits for a collective on a GPU (NCCL's wait(), which the window's
// gradient sync does not use) are counted too. Reads outside the window
// loop (the planner's probes, validation, checkpoints) belong to no
// window.

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

void count_host_sync() {
  g_host_syncs.fetch_add(1, std::memory_order_relaxed);
}

std::vector<double> read_to_host(const at::Tensor& t, const DeviceWait& wait) {
  count_host_sync();
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
