#include "memtrain/train/logs/progress.h"

#include <cmath>

namespace memtrain {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0)
    return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(
        buf,
        sizeof(buf),
        "%ld:%02ld:%02ld",
        long(s / 3600),
        long(s / 60 % 60),
        long(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%ld:%02ld", long(s / 60), long(s % 60));
  }
  return buf;
}

Progress::Progress(std::FILE* out, bool is_tty, double every_s)
    : out_(out),
      tty_(is_tty),
      every_s_(every_s),
      start_(std::chrono::steady_clock::now()),
      last_print_(start_) {}

void Progress::window(
    int64_t epoch,
    int64_t epochs,
    int64_t window,
    int64_t windows_per_epoch,
    double loss,
    double samples_per_s,
    int64_t done,
    int64_t total) {
  if (!out_)
    return;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const bool last = done == total;
  if (!tty_) {
    const double since =
        std::chrono::duration<double>(now - last_print_).count();
    // The first window, then at most one line per every_s, and the last.
    if (printed_any_ && !last && since < every_s_)
      return;
  }
  const double eta = done > 0 ? elapsed / done * (total - done) : NAN;
  char buf[256];
  std::snprintf(
      buf,
      sizeof(buf),
      "epoch %ld/%ld  window %ld/%ld  loss %.4f  %.0f samples/s  "
      "elapsed %s  ETA %s",
      long(epoch + 1),
      long(epochs),
      long(window + 1),
      long(windows_per_epoch),
      loss,
      samples_per_s,
      format_duration(elapsed).c_str(),
      format_duration(eta).c_str());
  if (tty_) {
    std::fprintf(out_, "\r\033[K%s", buf);
    pending_redraw_ = true;
  } else {
    std::fprintf(out_, "%s\n", buf);
  }
  std::fflush(out_);
  printed_any_ = true;
  last_print_ = now;
}

void Progress::line(const std::string& text) {
  if (!out_)
    return;
  if (pending_redraw_) {
    std::fputc('\n', out_);
    pending_redraw_ = false;
  }
  std::fprintf(out_, "%s\n", text.c_str());
  std::fflush(out_);
}

}  // namespace memtrain
