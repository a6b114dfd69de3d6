#include "memtrain/dist/gradient_sync.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>

#include "memtrain/device/host_sync.h"
#include "memtrain/dist/communicator.h"
#include "memtrain/util/error.h"

namespace memtrain {

// Note [All-reduce only at the accumulation boundary]
// Micro-steps accumulate into each parameter's .grad locally; nothing is
// exchanged until the window's last micro-step runs its backward. Then
// GradientSync moves every gradient element exactly once. Compared with
// reducing after every micro-step (what a DDP model without no_sync() does),
// this divides gradient traffic by the accumulation steps, and it is what the
// tests count: micro-steps 1..K-1 move zero bytes, step K moves the gradient
// once.

// Note [Overlapping the boundary all-reduce]
// In the last micro-step's backward, a bucket's gradients are final as soon
// as autograd has accumulated the last of them; c10d's reducer starts that
// bucket's all-reduce right then, while backward computes earlier layers.
// So does GradientSync after arm(): a post-hook on every parameter's
// AccumulateGrad node counts the bucket's pending gradients, and bucket b
// is launched (asynchronously) once it is complete and buckets 0..b-1 are
// launched -- buckets are filled in reverse registration order, so that
// order is close to backward's, and it is the same on every rank whatever
// each rank's timing, which collectives require. Each hook also polls the
// works in flight, which is what drives MPI's progress (Open MPI has no
// progress thread). The last bucket carries the window's totals, known
// only after backward, and is launched by sync(). Outside an armed
// backward the hooks do nothing: micro-steps 1..K-1 still move zero bytes.
// An out-of-memory error in the armed backward (after some buckets are in
// flight) keeps the sequence of collectives identical on every rank: the
// launched buckets held this rank's complete window gradient for their
// parameters (every micro-step's contribution was in), so their sums stand;
// attach() waits for them, the replay accumulates those parameters
// elsewhere, and sync() launches only the buckets not launched yet.

namespace {

using torch::autograd::variable_list;

constexpr int64_t kTailBucketBytes = int64_t{1} << 20;

// Parameter `p`'s slot of a bucket, from element `offset`, viewed with p's
// strides when p is dense (as c10d's gradient_as_bucket_view): a
// channels-last parameter gets a channels-last gradient, which the
// optimizers' multi-tensor and fused kernels need (their fast paths take
// tensors of one layout).
at::Tensor slot_view(
    const at::Tensor& flat, int64_t offset, const at::Tensor& p) {
  const at::Tensor slot = flat.narrow(0, offset, p.numel());
  if (p.is_non_overlapping_and_dense())
    return slot.as_strided(p.sizes(), p.strides());
  return slot.view(p.sizes());
}

}  // namespace

GradientSync::GradientSync(
    Communicator& comm,
    std::vector<at::Tensor> params,
    int64_t bucket_bytes,
    int64_t num_extras)
    : comm_(comm), params_(std::move(params)), num_extras_(num_extras) {
  MT_INTERNAL_ASSERT(bucket_bytes > 0 && num_extras >= 0);
  const int64_t bucket_elems = std::max<int64_t>(1, bucket_bytes / 4);
  // Buckets live where the parameters do (the placement's device).
  const auto options = params_.empty()
                           ? torch::TensorOptions().dtype(torch::kFloat32)
                           : params_[0].options().dtype(torch::kFloat32);
  bucket_of_.resize(params_.size());
  // The last bucket starts only after backward (it carries the totals), so
  // its all-reduce is what overlap cannot hide: it holds the first
  // parameters up to kTailBucketBytes at most (c10d keeps its first bucket
  // small for the mirror reason).
  const int64_t tail_elems =
      std::min(bucket_elems, std::max<int64_t>(1, kTailBucketBytes / 4));
  size_t tail_end = 0;  // parameters [0, tail_end) go to the last bucket
  for (int64_t n = 0; tail_end < params_.size();) {
    n += params_[tail_end].numel();
    if (tail_end > 0 && n > tail_elems)
      break;
    ++tail_end;
  }
  Bucket current;
  int64_t filled = 0;
  auto add = [&](size_t k) {
    current.params.push_back(k);
    current.offsets.push_back(filled);
    bucket_of_[k] = buckets_.size();
    filled += params_[k].numel();
  };
  auto close = [&](int64_t extra) {
    current.flat = torch::zeros({filled + extra}, options);
    buckets_.push_back(std::move(current));
    current = Bucket();
    filled = 0;
  };
  for (size_t k = params_.size(); k-- > tail_end;) {  // reverse order
    if (filled > 0 && filled + params_[k].numel() > bucket_elems)
      close(0);
    add(k);
  }
  if (filled > 0)
    close(0);
  for (size_t k = tail_end; k-- > 0;)
    add(k);
  close(num_extras_);  // the last bucket (possibly only extras)
  works_.resize(buckets_.size());
  pending_.assign(buckets_.size(), 0);
  seen_.assign(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].requires_grad())
      continue;
    std::shared_ptr<torch::autograd::Node> acc =
        torch::autograd::impl::grad_accumulator(params_[i]);
    if (!acc)
      continue;
    hook_keys_.push_back(acc->add_post_hook(
        std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [this, i](const variable_list& outputs, const variable_list&) {
              on_gradient(i);
              return outputs;
            })));
    accumulators_.push_back(std::move(acc));
  }
}

GradientSync::~GradientSync() {
  for (size_t k = 0; k < accumulators_.size(); ++k)
    accumulators_[k]->del_post_hook(hook_keys_[k]);
  works_.clear();  // waits for anything still in flight
}

void GradientSync::flag_nonfinite(const at::Tensor& found) const {
  std::vector<at::Tensor> flats;
  for (const auto& b : buckets_)
    flats.push_back(b.flat);
  memtrain::flag_nonfinite(flats, 1.0, found);
}

int64_t GradientSync::bytes_per_sync() const {
  int64_t bytes = 0;
  for (const auto& b : buckets_)
    bytes += b.flat.numel() * 4;
  return bytes;
}

void GradientSync::attach() {
  torch::NoGradGuard no_grad;
  armed_ = false;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    if (b < launched_) {
      // Launched in an earlier try of this window: its sum stands (see
      // Note [Overlapping the boundary all-reduce]); a replay's gradients
      // for these parameters go to fresh tensors that sync() drops.
      works_[b]->wait();
      for (size_t j : bucket.params)
        params_[j].mutable_grad() = at::Tensor();
      continue;
    }
    bucket.flat.zero_();
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      at::Tensor& p = params_[bucket.params[j]];
      p.mutable_grad() = slot_view(bucket.flat, bucket.offsets[j], p);
    }
  }
}

void GradientSync::arm() {
  // GPU buckets over MPI go through host copies from autograd's device
  // thread, where MPI (initialised FUNNELED) may not be called: no overlap.
  if (!buckets_.front().flat.is_cpu() && comm_.backend() == BackendChoice::kMpi)
    return;
  // A sum that is complete when started (MPI through shared memory) would
  // only make the ranks meet once per bucket inside backward: 0.46 s vs
  // 0.43 s a window for benchmarks/vs_pytorch's MLP. Reduce at sync().
  if (!comm_.all_reduce_overlaps())
    return;
  armed_ = true;
  std::fill(seen_.begin(), seen_.end(), false);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    pending_[b] = 0;
    for (size_t j : buckets_[b].params) {
      if (params_[j].requires_grad())
        ++pending_[b];
    }
  }
}

void GradientSync::on_gradient(size_t param) {
  if (!armed_)
    return;
  if (inject_after_ >= 0 && static_cast<int64_t>(launched_) >= inject_after_) {
    inject_after_ = -1;
    TORCH_CHECK_WITH(
        OutOfMemoryError,
        false,
        "GradientSync: injected out-of-memory error after ",
        launched_,
        " bucket(s) were launched");
  }
  MT_INTERNAL_ASSERT(
      !seen_[param],
      "parameter ",
      param,
      " received its gradient twice in one backward; a bucket holding it "
      "may already be in flight");
  seen_[param] = true;
  const size_t b = bucket_of_[param];
  if (b >= launched_ && --pending_[b] == 0)
    launch_ready();
  for (size_t k = 0; k < launched_; ++k) {  // drive MPI's progress
    if (works_[k] && works_[k]->test())
      continue;
    break;
  }
}

void GradientSync::launch_ready() {
  torch::NoGradGuard no_grad;
  while (launched_ + 1 < buckets_.size() && pending_[launched_] == 0) {
    launch(launched_);
    ++launched_;
  }
}

void GradientSync::launch(size_t b) {
  Bucket& bucket = buckets_[b];
  for (size_t j = 0; j < bucket.params.size(); ++j) {
    at::Tensor& p = params_[bucket.params[j]];
    at::Tensor slot = slot_view(bucket.flat, bucket.offsets[j], p);
    const at::Tensor& g = p.grad();
    if (g.defined() && g.data_ptr() == slot.data_ptr())
      continue;  // a view: the gradient is already in the bucket
    if (g.defined()) {
      slot.copy_(g);
    } else {
      slot.zero_();
    }
    p.mutable_grad() = slot;
  }
  works_[b] = comm_.all_reduce_async(bucket.flat, ReduceOp::kSum);
}

at::Tensor GradientSync::sync(const at::Tensor& extras) {
  MT_INTERNAL_ASSERT(
      num_extras_ == 0 ? !extras.defined() : extras.numel() == num_extras_);
  torch::NoGradGuard no_grad;
  armed_ = false;
  const size_t first_now = launched_;  // launched before: their sums stand
  Bucket& last = buckets_.back();
  at::Tensor tail;
  if (num_extras_ > 0) {
    tail = last.flat.narrow(0, last.flat.numel() - num_extras_, num_extras_);
  }
  for (size_t b = first_now; b < buckets_.size(); ++b) {
    if (b + 1 == buckets_.size() && tail.defined())
      tail.copy_(extras.reshape({-1}), /*non_blocking=*/true);
    launch(b);
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    // NCCL: the current stream waits, the host does not; the caller's
    // read of the totals watches the collectives (Note [One host read per
    // window]).
    works_[b]->wait_on_device();
    works_[b].reset();
    // Every parameter's gradient is its slot of the summed bucket (a
    // replay's fresh gradient for an early-launched bucket is dropped).
    Bucket& bucket = buckets_[b];
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      at::Tensor& p = params_[bucket.params[j]];
      p.mutable_grad() = slot_view(bucket.flat, bucket.offsets[j], p);
    }
  }
  launched_early_ = static_cast<int64_t>(first_now);
  launched_ = 0;
  return tail.defined() ? tail.clone() : at::Tensor();
}

}  // namespace memtrain
