#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/torch.h>

#include <numeric>

#include "memtrain/memory/device_memory.h"
#include "memtrain/train/losses.h"
#include "memtrain/train/oom_guard.h"
#include "memtrain/util/error.h"
#include "run_state.h"

namespace memtrain {

// Note [Exact contrastive accumulation]
// A contrastive loss is not a sum of per-sample terms that only see their
// own sample: sample i's InfoNCE term has every other sample of its batch
// as negatives. Accumulating it over micro-batches (or ranks) the way a
// cross-entropy is accumulated changes the loss: each micro-batch of b
// sees b - 1 negatives instead of the effective batch's n - 1
// (training.contrastive_accumulation=local does exactly that, for
// comparison). With `exact` (the default) a window is one contrastive batch
// of its n samples, whatever the split into ranks x micro-steps x
// micro-batch, with the gradient-cache method (Gao et al., 2021):
//   1. every micro-batch of this rank is embedded without a graph (no
//      activations kept) and its host batch kept in host memory; the
//      generators' state before the first is saved;
//   2. one all-gather gives every rank the window's n x 2 x d embeddings, in
//      the window's order (rank shares are contiguous, WindowPlan::
//      rank_offset), and the window's pair ids come from the sampler;
//   3. every rank computes the same loss of the whole window, sum_i l_i x
//      (1/n) x loss scale (Note [Window weighting]), and its gradient with
//      respect to the embeddings and to the logit scale (n x n logits on
//      the device: 36 KiB at n = 96). Rank 0 alone adds the logit scale's
//      gradient to its .grad, so that the boundary sum counts it once;
//   4. the generators are restored and every micro-batch is run again with
//      its graph (dropout draws the same masks) and back-propagated from
//      its rows of the embedding gradient: by the chain rule the parameter
//      gradients summed over micro-batches and ranks are those of the
//      one-batch loss.
// The device holds one micro-batch's activations at a time, as in a plain
// window; the forward runs twice (README "Contrastive pairs": 1.33 s vs
// 1.01 s for local on one window of clip-v100.yaml). The boundary all-reduce of
// the gradients is still the window's only gradient exchange; the all-gather is
// counted apart (CommStats::allgather_*, the window record's
// allgather_calls/bytes). An OOM anywhere replays the window at half the
// micro-batch (Note [OOM recovery]): the update does not depend on the split.

namespace {

struct GeneratorStates {
  at::Tensor cpu, device;
};

GeneratorStates save_rng(const Placement& placement) {
  memory::HostScope host;
  GeneratorStates s;
  s.cpu = at::detail::getDefaultCPUGenerator().get_state();
  if (placement.is_cuda()) {
    s.device =
        at::globalContext().defaultGenerator(placement.device()).get_state();
  }
  return s;
}

void restore_rng(const Placement& placement, const GeneratorStates& s) {
  at::Generator cpu = at::detail::getDefaultCPUGenerator();  // a handle
  cpu.set_state(s.cpu);
  if (s.device.defined()) {
    at::Generator dev =
        at::globalContext().defaultGenerator(placement.device());
    dev.set_state(s.device);
  }
}

// A host copy of a prefetched batch, kept for the re-run (the prefetcher's
// buffer goes back to it).
Batch keep(const Batch& b) {
  Batch out;
  out.x = b.x.clone();
  out.y = b.y.clone();
  if (b.context.defined())
    out.context = b.context.clone();
  return out;
}

Batch on_device(const RunState& run, const Batch& host) {
  Batch d;
  d.x = run.placement.to_device(host.x);
  d.y = run.placement.to_device(host.y);
  if (host.context.defined())
    d.context = run.placement.to_device(host.context);
  return d;
}

}  // namespace

at::Tensor pair_ids(
    const DatasetInfo& info,
    const std::vector<int64_t>& rows,
    const c10::Device& device) {
  std::vector<int64_t> ids(rows);
  if (!info.row_labels.empty()) {
    for (int64_t& r : ids)
      r = info.row_labels[r];
  }
  return torch::tensor(ids, torch::kInt64).to(device);
}

double contrastive_steps(
    RunState& run,
    const WindowPlan& wp,
    const std::vector<std::vector<int64_t>>& batches,
    double weight,
    const std::function<void(size_t)>& before_step) {
  const int64_t n = wp.global_samples;
  const int64_t mine_n = static_cast<int64_t>(wp.rank_indices.size());
  const int64_t d = run.cfg.model.embed_dim;
  const auto on = torch::TensorOptions().device(run.placement.device());

  // 1. Embed without a graph.
  const GeneratorStates rng = save_rng(run.placement);
  std::vector<Batch> kept;
  at::Tensor mine = torch::zeros({mine_n, 2, d}, on);
  {
    torch::NoGradGuard no_grad;
    int64_t row = 0;
    for (const auto& ids : batches) {
      {
        memory::HostScope host;
        Batch b = run.loader->load(wp.epoch, ids);
        kept.push_back(keep(b));
        run.loader->recycle(std::move(b));
      }
      const Batch dev = on_device(run, kept.back());
      const int64_t m = static_cast<int64_t>(ids.size());
      mine.narrow(0, row, m).copy_(forward(run, dev.x, dev.context));
      row += m;
    }
  }

  // 2. The window's embeddings, from every rank.
  const at::Tensor all =
      run.comm.all_gather_rows(mine, wp.rank_offset, n).requires_grad_(true);
  mine = at::Tensor();

  // 3. The loss of the whole window and its gradients.
  const at::Tensor& scale = run.dual->logit_scale();
  const at::Tensor losses = contrastive_losses(
      all,
      scale,
      pair_ids(
          run.train_data->info(),
          run.sampler->window_indices(wp.epoch, wp.window),
          run.placement.device()));
  const auto grads = torch::autograd::grad(
      {losses.sum() * (weight * run.scaler->scale())}, {all, scale});
  if (run.comm.rank() == 0)
    scale.mutable_grad().add_(grads[1]);
  const double loss =
      losses.detach().narrow(0, wp.rank_offset, mine_n).sum().item<double>();
  const at::Tensor grad_mine = grads[0].narrow(0, wp.rank_offset, mine_n);

  // 4. Each micro-batch again, with its graph, from its embeddings' gradient.
  restore_rng(run.placement, rng);
  int64_t row = 0;
  for (size_t k = 0; k < kept.size(); ++k) {
    before_step(k);
    Batch dev = on_device(run, kept[k]);
    const int64_t m = dev.x.size(0);
    const at::Tensor z = forward(run, dev.x, dev.context);
    dev = Batch();
    torch::autograd::backward({z}, {grad_mine.narrow(0, row, m)});
    row += m;
  }
  return loss;
}

ValResult validate_pairs(RunState& run, RunCounters& counters) {
  const H5Dataset& data = *run.val_data;
  const int64_t n = data.info().num_samples;
  const int64_t begin = n * run.comm.rank() / run.comm.size();
  const int64_t end = n * (run.comm.rank() + 1) / run.comm.size();
  const int64_t d = run.cfg.model.embed_dim;
  at::Tensor mine;
  {
    memory::HostScope host;  // offloaded: only one batch on the device
    mine = torch::zeros({end - begin, 2, d});
  }
  std::vector<int64_t> rows(end - begin);
  std::iota(rows.begin(), rows.end(), begin);
  const int64_t retries = for_each_val_batch(
      run, counters, rows, [&](const Batch& b, size_t first) {
        const at::Tensor z = forward(run, b.x, b.context);
        memory::HostScope host;
        mine.narrow(0, static_cast<int64_t>(first), b.size()).copy_(z.cpu());
      });
  ValResult r;
  {
    // The whole validation set as one contrastive batch, on the host
    // (n x n logits: about 3 n^2 x 4 bytes while it is scored).
    memory::HostScope host;
    const at::Tensor all = run.comm.all_gather_rows(mine, begin, n);
    std::vector<int64_t> rows(n);
    for (int64_t i = 0; i < n; ++i)
      rows[i] = i;
    const at::Tensor ids = pair_ids(data.info(), rows, torch::kCPU);
    const at::Tensor scale = run.dual->logit_scale().detach().cpu();
    r.loss = contrastive_losses(all, scale, ids).mean().item<double>();
    // Top-1 retrieval: the nearest b of each a is its own pair (and the
    // other way round); rows of the same pair id count as that pair.
    const at::Tensor sim = all.select(1, 0).mm(all.select(1, 1).t());
    const at::Tensor a_hit = ids.index_select(0, sim.argmax(1)).eq(ids);
    const at::Tensor b_hit = ids.index_select(0, sim.argmax(0)).eq(ids);
    r.accuracy = (a_hit.sum().item<double>() + b_hit.sum().item<double>()) /
                 (2.0 * static_cast<double>(n));
  }
  r.samples = n;
  r.oom_retries = retries;
  r.batch = counters.val_micro;
  return r;
}

}  // namespace memtrain
