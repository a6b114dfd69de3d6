#include "memtrain/train/state/window_totals.h"

#include <cmath>

#include "memtrain/util/error.h"

namespace memtrain {
namespace {

constexpr int64_t kHeader = 3;    // loss sum, samples, stop requests
constexpr int64_t kPerRank = 27;  // 13 byte counts x (hi, lo) + retries
constexpr int64_t kLow = int64_t{1} << 24;

void put_bytes(float* slot, int64_t v) {
  MT_INTERNAL_ASSERT(v >= 0 && v < kLow * kLow, "byte count ", v);
  slot[0] = static_cast<float>(v / kLow);
  slot[1] = static_cast<float>(v % kLow);
}

int64_t get_bytes(const float* slot) {
  return static_cast<int64_t>(std::llround(slot[0])) * kLow +
         static_cast<int64_t>(std::llround(slot[1]));
}

}  // namespace

int64_t WindowTotals::size(int world) {
  return kHeader + kPerRank * world;
}

std::vector<float> WindowTotals::pack(
    int64_t samples,
    bool stop,
    const RankWindowMemory& mine,
    int rank,
    int world) {
  std::vector<float> v(static_cast<size_t>(size(world)), 0.0f);
  v[1] = static_cast<float>(samples);
  v[2] = stop ? 1.0f : 0.0f;
  float* s = v.data() + kHeader + kPerRank * rank;
  put_bytes(s + 0, mine.allocated);
  put_bytes(s + 2, mine.reserved);
  put_bytes(s + 4, mine.peak);
  put_bytes(s + 6, mine.peak_reserved);
  s[8] = static_cast<float>(mine.oom_retries);
  put_bytes(s + 9, mine.host_reserved);
  put_bytes(s + 11, mine.host_peak);
  put_bytes(s + 13, mine.rss);
  put_bytes(s + 15, mine.rss_file);
  put_bytes(s + 17, mine.counted);
  put_bytes(s + 19, mine.malloc_free);
  put_bytes(s + 21, mine.malloc_used);
  put_bytes(s + 23, mine.counted_host);
  put_bytes(s + 25, mine.rss_peak);
  return v;
}

WindowTotals WindowTotals::unpack(const std::vector<float>& summed, int world) {
  MT_INTERNAL_ASSERT(static_cast<int64_t>(summed.size()) == size(world));
  WindowTotals t;
  t.loss_sum = summed[kLossSlot];
  t.samples = std::llround(summed[1]);
  t.stop_requests = std::llround(summed[2]);
  for (int r = 0; r < world; ++r) {
    const float* s = summed.data() + kHeader + kPerRank * r;
    RankWindowMemory m;
    m.allocated = get_bytes(s + 0);
    m.reserved = get_bytes(s + 2);
    m.peak = get_bytes(s + 4);
    m.peak_reserved = get_bytes(s + 6);
    m.oom_retries = std::llround(s[8]);
    m.host_reserved = get_bytes(s + 9);
    m.host_peak = get_bytes(s + 11);
    m.rss = get_bytes(s + 13);
    m.rss_file = get_bytes(s + 15);
    m.counted = get_bytes(s + 17);
    m.malloc_free = get_bytes(s + 19);
    m.malloc_used = get_bytes(s + 21);
    m.counted_host = get_bytes(s + 23);
    m.rss_peak = get_bytes(s + 25);
    t.ranks.push_back(m);
  }
  return t;
}

WindowTotals::Max WindowTotals::max_of(int64_t RankWindowMemory::*field) const {
  Max m;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (r == 0 || ranks[r].*field > m.value)
      m = {ranks[r].*field, static_cast<int>(r)};
  }
  return m;
}

int64_t WindowTotals::sum_of(int64_t RankWindowMemory::*field) const {
  int64_t s = 0;
  for (const auto& r : ranks)
    s += r.*field;
  return s;
}

}  // namespace memtrain
