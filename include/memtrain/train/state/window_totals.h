#pragma once
// WindowTotals: what rides with the gradient in a window's one all-reduce
// (see Note [All-reduce only at the accumulation boundary]): the loss sum,
// the sample count, the stop requests, and each rank's memory figures and
// OOM retries, so that every rank learns what every rank saw at no extra
// collective. Packed as float32 (the buckets' type): each rank writes only
// its own slots, so the sum over ranks is every rank's value, exactly --
// byte counts travel as two floats of 24 bits each (exact below 2^48).

#include <cstdint>
#include <vector>

namespace memtrain {

struct RankWindowMemory {
  int64_t allocated = 0;      // at the boundary
  int64_t reserved = 0;       // at the boundary
  int64_t peak = 0;           // allocated, since the previous boundary
  int64_t peak_reserved = 0;  // reserved, since the previous boundary
  int64_t oom_retries = 0;    // window replays
  // The host offload pool (Note [Host offload]); 0 without one.
  int64_t host_reserved = 0;  // at the boundary
  int64_t host_peak = 0;      // in use, since the previous boundary
  // The process's host memory at the boundary (memory/host_figures.h).
  int64_t rss = 0;
  int64_t rss_file = 0;
  int64_t counted = 0;
  int64_t malloc_free = 0;
  int64_t malloc_used = 0;
  int64_t counted_host = 0;
  int64_t rss_peak = 0;
};

struct WindowTotals {
  double loss_sum = 0.0;  // summed per-sample losses (float32 in transit)
  int64_t samples = 0;
  int64_t stop_requests = 0;            // ranks asked to stop
  std::vector<RankWindowMemory> ranks;  // by rank, after the sum

  // The float count for `world` ranks.
  static int64_t size(int world);
  // Where the loss sum goes: the window writes it there on the device
  // (Note [One host read per window]); pack() leaves it 0.
  static constexpr int64_t kLossSlot = 0;
  // This rank's contribution: its samples, stop flag and memory in its own
  // slots, zeros elsewhere.
  static std::vector<float> pack(
      int64_t samples,
      bool stop,
      const RankWindowMemory& mine,
      int rank,
      int world);
  // After the all-reduce (sum).
  static WindowTotals unpack(const std::vector<float>& summed, int world);

  // The largest value of a field over ranks and the lowest rank that had it.
  struct Max {
    int64_t value = 0;
    int rank = 0;
  };
  Max max_of(int64_t RankWindowMemory::*field) const;
  int64_t sum_of(int64_t RankWindowMemory::*field) const;
};

}  // namespace memtrain
