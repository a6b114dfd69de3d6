// Contrastive pairs (model.name=dual_encoder on a pair file): the
// symmetric InfoNCE of a window, exactly or per micro-batch
// (training.contrastive_accumulation), the logit scale clamped after each
// update, retrieval accuracy on data.val.

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <numeric>
#include <optional>

#include "memtrain/memory/device_memory.h"
#include "memtrain/model/losses.h"
#include "memtrain/model/nets/dual_encoder.h"
#include "memtrain/model/registry.h"
#include "memtrain/util/error.h"
#include "train/eval/val_batches.h"
#include "train/tasks/task.h"

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
// A rank whose share is one micro-batch embeds it in step 1 with its graph
// and back-propagates that in step 4 (under memory.budget, where step 3's
// scoring fits half the headroom beside the graph: one_pass_fits): the
// embeddings a second forward would give, so the forward runs once and the
// update is the same (to rounding, across an OOM replay, which re-splits
// the share and takes both passes).
// The device holds one micro-batch's activations at a time, as in a plain
// window; with several micro-batches the forward runs twice (docs/models.md
// "Contrastive pairs": 1.33 s vs 1.01 s for local on one window of
// clip-heads-v100.yaml). The boundary
// all-reduce of the gradients is still the window's only gradient exchange; the
// all-gather is counted apart (CommStats::allgather_*, the window record's
// allgather_calls/bytes). An OOM anywhere replays the window at half the
// micro-batch (Note [OOM recovery]): the update does not depend on the split.

namespace {

// The bytes of scoring n pairs' d-wide embeddings as one contrastive
// batch (contrastive_losses): `copies` n x 2 x d float32 tensors of
// embeddings, the n x n logits, pair-id and identity masks and the masked
// copy at 12 bytes a pair, and a few vectors of n.
int64_t scoring_bytes(int64_t n, int64_t d, int64_t copies) {
  return copies * n * 2 * d * 4 + 12 * n * n + 32 * n;
}

// The pair ids of dataset rows `rows` (DatasetInfo::row_labels, or the row
// index when the file has no /pair_ids), int64 in host memory, page-locked
// when `pinned` (so that its copy to a GPU does not wait).
at::Tensor pair_ids(
    const DatasetInfo& info, const std::vector<int64_t>& rows, bool pinned) {
  at::Tensor ids = at::empty(
      {static_cast<int64_t>(rows.size())},
      at::TensorOptions().dtype(at::kLong).pinned_memory(pinned));
  int64_t* p = ids.data_ptr<int64_t>();
  for (size_t i = 0; i < rows.size(); ++i)
    p[i] = info.row_labels.empty() ? rows[i] : info.row_labels[rows[i]];
  return ids;
}

// A copy of host tensor `t`, page-locked as it is (so that its copies to
// the device stay asynchronous).
at::Tensor keep(const at::Tensor& t) {
  at::Tensor out =
      at::empty(t.sizes(), t.options().pinned_memory(t.is_pinned()));
  return out.copy_(t);
}

// A host copy of a prefetched batch, kept for the re-run (the prefetcher's
// buffer goes back to it).
Batch keep(const Batch& b) {
  Batch out;
  out.x = keep(b.x);
  out.y = keep(b.y);
  if (b.context.defined())
    out.context = keep(b.context);
  return out;
}

class PairTask : public Task {
 public:
  explicit PairTask(const TrainConfig& cfg)
      : exact_(
            cfg.training.contrastive_accumulation ==
            ContrastiveAccumulation::kExact) {}

  void set_up(RunState& run) override {
    open_val_data(run);
    resolve_num_classes(run, /*binary=*/false);
    run.images = resolve_image_transforms(
        run.cfg, run.train_data->info(), /*episodes_or_pairs=*/true);
    run.source = std::make_unique<RowSource>(
        *run.train_data, run.images.train, &run.train_finite);
  }

  std::shared_ptr<Classifier> make_model(const RunState& run) override {
    dual_ = make_pair_encoder(run.cfg.model, model_input(run));
    return dual_;
  }

  // The symmetric InfoNCE of the micro-batch (logits: embeddings (n, 2,
  // d); y: pair ids): contrastive_accumulation=local, and the planner's
  // probes.
  at::Tensor loss_sum(
      const at::Tensor& logits, const at::Tensor& y) const override {
    return contrastive_losses(logits, dual_->logit_scale(), y).sum();
  }

  at::Tensor accumulate(
      RunState& run,
      const WindowPlan& wp,
      const std::vector<std::vector<int64_t>>& batches,
      double weight,
      const std::function<void(size_t)>& before_step) override {
    if (!exact_)
      return Task::accumulate(run, wp, batches, weight, before_step);
    return exact_window(run, wp, batches, weight, before_step);
  }

  void after_update() override {
    dual_->clamp_logit_scale();
  }

  std::vector<MetricSpec> metrics() const override {
    return {{"val_accuracy", Better::kHigher}};
  }

  std::string kind_words() const override {
    return "contrastive pairs";
  }

  ValResult validate(
      RunState& run, RunCounters& counters, const std::string&) override;

  std::vector<memory::HostHolder> host_holders(
      const RunState& run) const override;

  std::string describe_outputs(const RunState& run) const override {
    return std::to_string(dual_->embed_dim()) +
           "-wide embeddings, contrastive accumulation " +
           to_string(run.cfg.training.contrastive_accumulation);
  }

 private:
  // Note [Exact contrastive accumulation]. Collective (one all-gather).
  // Returns this rank's rows' share of the window's loss sum (on the
  // device, float64 (1,)).
  at::Tensor exact_window(
      RunState& run,
      const WindowPlan& wp,
      const std::vector<std::vector<int64_t>>& batches,
      double weight,
      const std::function<void(size_t)>& before_step);

  const bool exact_;
  std::shared_ptr<PairEncoder> dual_;
};

// Step 3 of a one-pass window runs beside the micro-batch's graph, which
// the planner's probes (one micro-batch's own loss) did not measure with
// it: the window's gathered n x 2 x d embeddings, their gradient and a
// copy, and its n x n scoring at 12 bytes a pair (as host_holders counts
// it). Under memory.budget the pass is taken where that fits in half the
// headroom the planner keeps free; without a budget, always.
namespace {
bool one_pass_fits(const RunState& run, int64_t n, int64_t d) {
  if (!run.budget.limited())
    return true;
  // The gathered embeddings, their gradient and a copy.
  const int64_t scoring = scoring_bytes(n, d, 3);
  const double headroom =
      static_cast<double>(run.budget.bytes) * run.budget.headroom;
  return static_cast<double>(scoring) <= headroom / 2;
}
}  // namespace

at::Tensor PairTask::exact_window(
    RunState& run,
    const WindowPlan& wp,
    const std::vector<std::vector<int64_t>>& batches,
    double weight,
    const std::function<void(size_t)>& before_step) {
  const int64_t n = wp.global_samples;
  const int64_t mine_n = static_cast<int64_t>(wp.rank_indices.size());
  const int64_t d = dual_->embed_dim();
  const auto on = torch::TensorOptions().device(run.placement.device());

  // 1. Embed without a graph; with one micro-batch on this rank, with its
  // graph, kept for step 4 instead of a second forward, where step 3's
  // window-wide scoring fits the memory.budget's headroom beside it.
  const bool one = batches.size() == 1 && one_pass_fits(run, n, d);
  const RngState rng = run.placement.rng_state();
  std::vector<Batch> kept;
  at::Tensor mine = torch::zeros({mine_n, 2, d}, on);
  at::Tensor z_one;  // `one`: the micro-batch's embeddings, with the graph
  {
    std::optional<torch::NoGradGuard> no_grad;
    if (!one)
      no_grad.emplace();
    int64_t row = 0;
    for (const auto& ids : batches) {
      if (one) {
        before_step(0);
        Batch dev = load_batch(run, *run.loader, wp.epoch, ids);
        z_one = forward(run, dev.x, dev.context);
        dev = Batch();
        mine.copy_(z_one.detach());
        break;
      }
      {
        memory::HostScope host;
        Batch b = run.loader->load(wp.epoch, ids);
        kept.push_back(keep(b));
        run.loader->recycle(std::move(b));
      }
      const Batch dev = to_device(run, kept.back());
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
  const at::Tensor& scale = dual_->logit_scale();
  const at::Tensor losses = contrastive_losses(
      all,
      scale,
      run.placement.to_device(pair_ids(
          run.train_data->info(),
          run.sampler->window_indices(wp.epoch, wp.window),
          run.placement.pinned_host_buffers())));
  const auto grads = torch::autograd::grad(
      {losses.sum() * (weight * run.scaler->scale())}, {all, scale});
  if (run.comm.rank() == 0)
    scale.mutable_grad().add_(grads[1]);
  const at::Tensor loss = losses.detach()
                              .narrow(0, wp.rank_offset, mine_n)
                              .sum()
                              .to(torch::kFloat64)
                              .reshape({1});
  const at::Tensor grad_mine = grads[0].narrow(0, wp.rank_offset, mine_n);

  // 4. Each micro-batch again, with its graph, from its embeddings' gradient.
  if (one) {
    torch::autograd::backward({z_one}, {grad_mine});
    return loss;
  }
  run.placement.set_rng_state(rng);
  int64_t row = 0;
  for (size_t k = 0; k < kept.size(); ++k) {
    before_step(k);
    Batch dev = to_device(run, kept[k]);
    const int64_t m = dev.x.size(0);
    const at::Tensor z = forward(run, dev.x, dev.context);
    dev = Batch();
    torch::autograd::backward({z}, {grad_mine.narrow(0, row, m)});
    row += m;
  }
  return loss;
}

// What validate() holds in host memory at most (Note [Host plan]): this
// rank's r rows' embeddings (r x 2 x d floats) throughout; while they are
// computed, the batches' buffers; then the whole set's n x 2 x d and its
// scoring, n x n: in contrastive_losses the logits, the pair-id and
// identity masks and the masked copy (4 + 1 + 1 + 1 + 1 + 4 bytes a pair),
// and a few vectors of n.
std::vector<memory::HostHolder> PairTask::host_holders(
    const RunState& run) const {
  if (!run.val_data)
    return {};
  const int64_t n = run.val_data->info().num_samples;
  const int64_t r = static_cast<int64_t>(val_rows_of_rank(run).rows.size());
  const int64_t d = dual_->embed_dim();
  const int64_t mine = r * 2 * d * 4;
  const int64_t batches = val_batches_host_bytes(run);
  const int64_t scoring = scoring_bytes(n, d, 1);
  memory::HostHolder h;
  h.name = "validation";
  h.bytes = mine + std::max(batches, scoring);
  h.how = detail::concat(
      "the validation set as one contrastive batch: ",
      n,
      " pairs' ",
      d,
      "-wide embeddings (",
      format_bytes(static_cast<double>(n * 2 * d * 4)),
      ", this rank's ",
      r,
      " kept throughout) and their ",
      n,
      " x ",
      n,
      " scoring at 12 bytes a pair (",
      format_bytes(static_cast<double>(12 * n * n)),
      ")");
  h.lower = "data.val (fewer pairs: the scoring grows with their square)";
  return {h};
}

// Every row embedded (one batch at a time on the device, embeddings kept in
// host memory), gathered; loss = the symmetric InfoNCE of the whole
// validation set as one batch, accuracy = top-1 retrieval (a -> b and b ->
// a, averaged).
ValResult PairTask::validate(
    RunState& run, RunCounters& counters, const std::string&) {
  const H5Dataset& data = *run.val_data;
  const int64_t n = data.info().num_samples;
  const RowShare share = val_rows_of_rank(run);
  const int64_t begin = share.begin;
  const std::vector<int64_t>& rows = share.rows;
  const int64_t end = begin + static_cast<int64_t>(rows.size());
  const int64_t d = dual_->embed_dim();
  at::Tensor mine;
  {
    memory::HostScope host;  // offloaded: only one batch on the device
    mine = torch::zeros({end - begin, 2, d});
  }
  const int64_t retries = for_each_val_batch(
      run, counters, rows, [&](const Batch& b, size_t first) {
        const at::Tensor z = forward(run, b.x, b.context);
        memory::HostScope host;
        mine.narrow(0, static_cast<int64_t>(first), b.size()).copy_(z.cpu());
      });
  ValResult r;
  double accuracy = 0.0;
  {
    // The whole validation set as one contrastive batch, on the host
    // (n x n logits: about 3 n^2 x 4 bytes while it is scored).
    memory::HostScope host;
    const at::Tensor all = run.comm.all_gather_rows(mine, begin, n);
    std::vector<int64_t> rows(n);
    for (int64_t i = 0; i < n; ++i)
      rows[i] = i;
    const at::Tensor ids = pair_ids(data.info(), rows, /*pinned=*/false);
    const at::Tensor scale = dual_->logit_scale().detach().cpu();
    r.loss = contrastive_losses(all, scale, ids).mean().item<double>();
    // Top-1 retrieval: the nearest b of each a is its own pair (and the
    // other way round); rows of the same pair id count as that pair.
    const at::Tensor sim = all.select(1, 0).mm(all.select(1, 1).t());
    const at::Tensor a_hit = ids.index_select(0, sim.argmax(1)).eq(ids);
    const at::Tensor b_hit = ids.index_select(0, sim.argmax(0)).eq(ids);
    accuracy = (a_hit.sum().item<double>() + b_hit.sum().item<double>()) /
               (2.0 * static_cast<double>(n));
  }
  r.samples = n;
  r.oom_retries = retries;
  r.batch = counters.val_micro;
  r.metrics = {
      val_metric("val_accuracy", accuracy, Better::kHigher, "val accuracy")};
  r.details = nlohmann::json({{"val_samples", r.samples}}).dump();
  return r;
}

}  // namespace

std::unique_ptr<Task> make_pair_task(const TrainConfig& cfg) {
  return std::make_unique<PairTask>(cfg);
}

}  // namespace memtrain
