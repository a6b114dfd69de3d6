#include "memtrain/dist/gradient_sync.h"

#include <torch/torch.h>

#include "memtrain/dist/communicator.h"
#include "memtrain/util/error.h"

namespace memtrain {

// Note [All-reduce only at the accumulation boundary]
// Micro-steps accumulate into each parameter's .grad locally; nothing is
// exchanged until the window's last micro-step has run its backward. Then
// GradientSync moves every gradient element exactly once. Compared with
// reducing after every micro-step (what a DDP model without no_sync() does),
// this divides gradient traffic by the accumulation steps, and it is what the
// tests count: micro-steps 1..K-1 move zero bytes, step K moves the gradient
// once.

GradientSync::GradientSync(
    Communicator& comm,
    std::vector<at::Tensor> params,
    int64_t bucket_bytes,
    int64_t num_extras)
    : comm_(comm), params_(std::move(params)), num_extras_(num_extras) {
  MT_INTERNAL_ASSERT(bucket_bytes > 0 && num_extras >= 0);
  const int64_t bucket_elems = std::max<int64_t>(1, bucket_bytes / 4);
  Bucket current;
  int64_t filled = 0;
  // Buckets live where the parameters do (the placement's device).
  const auto options = params_.empty()
                           ? torch::TensorOptions().dtype(torch::kFloat32)
                           : params_[0].options().dtype(torch::kFloat32);
  auto close = [&](int64_t extra) {
    current.flat = torch::zeros({filled + extra}, options);
    buckets_.push_back(std::move(current));
    current = Bucket();
    filled = 0;
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t n = params_[i].numel();
    if (filled > 0 && filled + n > bucket_elems)
      close(0);
    current.params.push_back(i);
    current.offsets.push_back(filled);
    filled += n;
  }
  close(num_extras_);  // the last bucket (possibly only extras)
}

bool GradientSync::all_finite() const {
  // Without allocating: a mask the size of the gradient (isfinite) or a
  // float64 copy (sum with a dtype) would raise the step's peak memory.
  for (const auto& b : buckets_) {
    if (b.flat.is_cpu()) {
      const float* p = b.flat.data_ptr<float>();
      const int64_t n = b.flat.numel();
      for (int64_t i = 0; i < n; ++i) {
        if (!std::isfinite(p[i]))
          return false;
      }
    } else if (!torch::isfinite(b.flat).all().item<bool>()) {
      return false;
    }
  }
  return true;
}

int64_t GradientSync::bytes_per_sync() const {
  int64_t bytes = 0;
  for (const auto& b : buckets_)
    bytes += b.flat.numel() * 4;
  return bytes;
}

void GradientSync::attach() {
  torch::NoGradGuard no_grad;
  for (Bucket& bucket : buckets_) {
    bucket.flat.zero_();
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      at::Tensor& p = params_[bucket.params[j]];
      p.mutable_grad() =
          bucket.flat.narrow(0, bucket.offsets[j], p.numel()).view(p.sizes());
    }
  }
}

void GradientSync::sync(std::vector<float>& extras) {
  MT_INTERNAL_ASSERT(static_cast<int64_t>(extras.size()) == num_extras_);
  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      at::Tensor& p = params_[bucket.params[j]];
      auto slot = bucket.flat.narrow(0, bucket.offsets[j], p.numel());
      const at::Tensor& g = p.grad();
      if (g.defined() && g.data_ptr() == slot.data_ptr())
        continue;  // a view
      if (g.defined()) {
        slot.copy_(g.reshape({-1}));
      } else {
        slot.zero_();
      }
      p.mutable_grad() = slot.view(p.sizes());
    }
    const bool last = b + 1 == buckets_.size();
    at::Tensor tail;
    if (last && num_extras_ > 0) {
      tail =
          bucket.flat.narrow(0, bucket.flat.numel() - num_extras_, num_extras_);
      tail.copy_(
          torch::from_blob(extras.data(), {num_extras_}, torch::kFloat32));
    }
    comm_.all_reduce_sum(bucket.flat);
    if (tail.defined()) {
      torch::from_blob(extras.data(), {num_extras_}, torch::kFloat32)
          .copy_(tail);
    }
  }
}

}  // namespace memtrain
