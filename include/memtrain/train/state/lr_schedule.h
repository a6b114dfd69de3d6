#pragma once
// The learning rate of each window: linear warmup, then constant, cosine or
// poly decay (training.lr_schedule). A function of the window's position
// alone, so a resumed run uses exactly the rates of the uninterrupted one.

#include <cstdint>

#include "memtrain/config/train_config.h"

namespace memtrain {

// The rate of window `step` (0-based, counted over the whole run) of a run
// of `total` windows (training.epochs x windows per epoch). Warmup: window
// s < W uses lr x (s + 1) / W. After it, with t = (s - W) / (total - W):
// constant lr; cosine min_lr + (lr - min_lr)(1 + cos(pi t)) / 2; poly
// min_lr + (lr - min_lr)(1 - t)^poly_power — the closed forms PyTorch
// documents for CosineAnnealingLR (T_max = total - W, eta_min = min_lr)
// and PolynomialLR (total_iters = total - W; min_lr 0), stepped once per
// window (compared with the formulas, not run against PyTorch).
double lr_at(const TrainingConfig& t, int64_t step, int64_t total);

}  // namespace memtrain
