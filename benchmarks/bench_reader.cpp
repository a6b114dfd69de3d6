// bench_reader: the volume patch reader. Patches per second and MB/s read
// from a volume file on disk by the Prefetcher over a PatchSource, for each
// number of read threads x queue depth (and simulated training step time),
// against a plain sequential read of the same number of bytes; and whether
// the training step waits on data: time blocked in load() per window.
//
//   bench_reader [--file F.h5] [--volumes 8] [--volume-size 128] [--chunk 32]
//                [--patch 64] [--batch 2] [--batches 40] [--window 4]
//                [--threads 1,2,4] [--depths 1,2,4] [--compute-ms 0]
//                [--step-ms 0] [--spin] [--repeat 1] [--seed 0] [--cold]
//
// Without --file it writes a synthetic volume file (make_synthetic, kind
// "volumes", float32) into a temp folder and removes it afterwards. The
// consumer drives the Prefetcher as the trainer does: expect() a window's
// micro-batches, load() them in order (sleeping --compute-ms after each: the
// simulated forward/backward), expect_more() the next window's, then sleep
// --step-ms (the simulated all-reduce + optimizer step). threads 0 / depth 0
// is the no-prefetch reference (reads in place on the training thread).
//
// Bytes: a patch is C * patch^3 float32 values plus patch^3 mask labels at
// their stored size; MB = 10^6 bytes. Every configuration opens the file
// afresh (empty HDF5 chunk cache) and reads the same patches; the page cache
// is warmed once before timing (or, with --cold, the file's pages are
// evicted with posix_fadvise before every timed run).

#include <fcntl.h>
#include <hdf5.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <torch/torch.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>

#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/data/sampling/patch_sampler.h"
#include "memtrain/data/synthetic/synthetic.h"
#include "memtrain/input/batch_loader.h"
#include "memtrain/input/prefetcher.h"
#include "memtrain/util/error.h"

using namespace memtrain;

namespace {

using Clock = std::chrono::steady_clock;
using Ids = std::vector<int64_t>;
using Window = std::vector<Ids>;

// Leaves the benchmark with an exit status once the message is printed.
struct Exit {
  int rc;
};

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// "1,2,4" -> {1, 2, 4}; false on anything else.
bool parse_list(const std::string& text, std::vector<int64_t>& out) {
  out.clear();
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (used != item.size())
        return false;
      out.push_back(v);
    } catch (const std::exception&) {
      return false;
    }
  }
  return !out.empty();
}

// A file opened for one timed run: a fresh H5Dataset (empty chunk cache),
// its sampler and the PatchSource the trainer would build.
struct Opened {
  H5Dataset data;
  PatchSampler sampler;
  PatchSource source;
  Opened(
      const std::string& path,
      const std::array<int64_t, 3>& patch,
      int64_t per_volume,
      uint64_t seed)
      : data(H5Dataset::open(path, "bench_reader --file")),
        sampler(data, patch, per_volume, 0.5, seed),
        source(data, sampler) {}
};

// The file's pages in the page cache: resident fraction (mincore), or -1.
double resident_fraction(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0)
    return -1;
  struct stat st {};
  double frac = -1;
  if (fstat(fd, &st) == 0 && st.st_size > 0) {
    void* p = mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      const long page = sysconf(_SC_PAGESIZE);
      const size_t pages = (st.st_size + page - 1) / page;
      std::vector<unsigned char> v(pages);
      if (mincore(p, st.st_size, v.data()) == 0) {
        size_t in = 0;
        for (unsigned char c : v)
          in += c & 1;
        frac = static_cast<double>(in) / static_cast<double>(pages);
      }
      munmap(p, st.st_size);
    }
  }
  ::close(fd);
  return frac;
}

// Plain read() of the whole file; returns seconds (bytes in `bytes`).
double read_whole_file(const std::string& path, int64_t& bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  MT_CHECK(fd >= 0, "cannot open '", path, "'");
  std::vector<char> buf(4 << 20);
  bytes = 0;
  const auto t0 = Clock::now();
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    MT_CHECK(n >= 0, "cannot read '", path, "'");
    if (n == 0)
      break;
    bytes += n;
  }
  const double s = seconds_since(t0);
  ::close(fd);
  return s;
}

// Evicts the file's clean pages from the page cache (no root needed).
void evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0)
    return;
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

std::string fs_type(const std::string& path) {
  struct statfs s {};
  if (statfs(path.c_str(), &s) != 0)
    return "unknown";
  switch (static_cast<unsigned long>(s.f_type)) {
    case 0x01021994UL:
      return "tmpfs (always in memory)";
    case 0xEF53UL:
      return "ext2/3/4";
    case 0x58465342UL:
      return "xfs";
    case 0x9123683EUL:
      return "btrfs";
    case 0x794C7630UL:
      return "overlayfs";
    case 0x6969UL:
      return "nfs";
    case 0x0BD00BD0UL:
      return "lustre";
    default: {
      char hex[32];
      std::snprintf(hex, sizeof hex, "0x%lx", (unsigned long)s.f_type);
      return hex;
    }
  }
}

// Size in bytes of one stored element of `dataset` in `path`, or 0.
size_t stored_element_size(const std::string& path, const char* dataset) {
  size_t size = 0;
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f >= 0) {
    const hid_t d = H5Dopen2(f, dataset, H5P_DEFAULT);
    if (d >= 0) {
      const hid_t t = H5Dget_type(d);
      if (t >= 0) {
        size = H5Tget_size(t);
        H5Tclose(t);
      }
      H5Dclose(d);
    }
    H5Fclose(f);
  }
  return size;
}

void simulate_step(double ms, bool spin) {
  if (ms <= 0)
    return;
  const auto until =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double, std::milli>(ms));
  if (spin) {
    while (Clock::now() < until) {
    }
  } else {
    std::this_thread::sleep_until(until);
  }
}

struct Measure {
  double wall_s = 0;
  double wait_s = 0;
  double wait_mean_ms = 0;  // per window
  double wait_max_ms = 0;
  int64_t windows_waiting = 0;  // windows blocked > 1 ms
  int64_t misses = 0;
};

Measure run_once(
    const PatchSource& source,
    int64_t threads,
    int64_t depth,
    double compute_ms,
    double step_ms,
    bool spin,
    const std::vector<Window>& windows) {
  Measure m;
  Prefetcher p(source, depth, threads);
  std::vector<double> waits;
  const auto t0 = Clock::now();
  for (size_t w = 0; w < windows.size(); ++w) {
    p.expect(0, windows[w]);
    for (const Ids& ids : windows[w]) {
      Batch b = p.load(0, ids);
      simulate_step(compute_ms, spin);
      p.recycle(std::move(b));
    }
    if (w + 1 < windows.size())
      p.expect_more(0, windows[w + 1]);
    waits.push_back(p.take_wait_seconds());
    simulate_step(step_ms, spin);
  }
  m.wall_s = seconds_since(t0);
  for (double s : waits) {
    m.wait_s += s;
    m.wait_max_ms = std::max(m.wait_max_ms, 1e3 * s);
    m.windows_waiting += s > 1e-3 ? 1 : 0;
  }
  m.wait_mean_ms = 1e3 * m.wait_s / static_cast<double>(waits.size());
  m.misses = p.misses();
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_reader: volume patch reader throughput and data waits"};
  std::string file, threads_text = "1,2,4", depths_text = "1,2,4",
                    compute_text = "0";
  int64_t volumes = 8, volume_size = 128, chunk = 32, patch_edge = 64,
          batch = 2, batches = 40, window = 4, repeat = 1;
  uint64_t seed = 0;
  double step_ms = 0;
  bool spin = false, cold = false;
  app.add_option("--file", file, "volume file (default: a synthetic one)");
  app.add_option("--volumes", volumes, "synthetic: volumes in the file")
      ->capture_default_str();
  app.add_option("--volume-size", volume_size, "synthetic: volume edge")
      ->capture_default_str();
  app.add_option("--chunk", chunk, "synthetic: chunk edge (0: a whole volume)")
      ->capture_default_str();
  app.add_option("--patch", patch_edge, "patch edge in voxels")
      ->capture_default_str();
  app.add_option("--batch", batch, "patches per micro-batch")
      ->capture_default_str();
  app.add_option("--batches", batches, "micro-batches per configuration")
      ->capture_default_str();
  app.add_option("--window", window, "micro-batches per window")
      ->capture_default_str();
  app.add_option("--threads", threads_text, "read threads to try")
      ->capture_default_str();
  app.add_option("--depths", depths_text, "prefetch depths to try")
      ->capture_default_str();
  app.add_option(
         "--compute-ms",
         compute_text,
         "simulated training step per micro-batch (list, ms)")
      ->capture_default_str();
  app.add_option(
         "--step-ms", step_ms, "simulated all-reduce + optimizer per window")
      ->capture_default_str();
  app.add_flag("--spin", spin, "busy-wait the simulated steps (default sleep)");
  app.add_option("--repeat", repeat, "timed runs per configuration (median)")
      ->capture_default_str();
  app.add_option("--seed", seed, "sampler and synthetic seed")
      ->capture_default_str();
  app.add_flag(
      "--cold",
      cold,
      "evict the file from the page cache before every timed run");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  std::vector<int64_t> thread_list, depth_list, compute_list;
  auto bad = [](const std::string& msg) {
    std::fprintf(stderr, "bench_reader: bad argument: %s\n", msg.c_str());
    return 2;
  };
  if (!parse_list(threads_text, thread_list) ||
      *std::min_element(thread_list.begin(), thread_list.end()) < 1)
    return bad("--threads wants a list of integers >= 1, e.g. 1,2,4");
  if (!parse_list(depths_text, depth_list) ||
      *std::min_element(depth_list.begin(), depth_list.end()) < 1)
    return bad("--depths wants a list of integers >= 1, e.g. 1,2,4");
  if (!parse_list(compute_text, compute_list) ||
      *std::min_element(compute_list.begin(), compute_list.end()) < 0)
    return bad("--compute-ms wants a list of integers >= 0, e.g. 0,50");
  if (patch_edge < 1 || batch < 1 || batches < 1 || window < 1 || repeat < 1 ||
      step_ms < 0)
    return bad(
        "--patch, --batch, --batches, --window and --repeat must be >= 1, "
        "--step-ms >= 0");
  if (file.empty() && (volumes < 1 || volume_size < 1 || chunk < 0))
    return bad("--volumes and --volume-size must be >= 1, --chunk >= 0");
  if (file.empty() && patch_edge > volume_size)
    return bad("--patch is larger than --volume-size");
  if (!file.empty() && !std::filesystem::exists(file))
    return bad("--file '" + file + "' does not exist");

  int rc = 0;
  std::string dir;
  try {
    const auto t_total = Clock::now();
    if (file.empty()) {
      char tmpl[] = "/tmp/bench_reader-XXXXXX";
      MT_CHECK(mkdtemp(tmpl) != nullptr, "cannot make a temp folder");
      dir = tmpl;
      SyntheticSpec s;
      s.kind = "volumes";
      s.samples = volumes;
      s.channels = 1;
      s.classes = 3;
      s.depth = s.height = s.width = volume_size;
      s.chunk = chunk;
      s.dtype = "float32";
      s.seed = seed;
      file = dir + "/volumes.h5";
      const auto t0 = Clock::now();
      make_synthetic(s, file);
      std::printf(
          "# generated %s (%ld x 1 x %ld^3 float32, chunk %ld) in %.1f s\n",
          file.c_str(),
          static_cast<long>(volumes),
          static_cast<long>(volume_size),
          static_cast<long>(chunk),
          seconds_since(t0));
    }

    // --- the file and the machine -------------------------------------
    const std::array<int64_t, 3> patch{patch_edge, patch_edge, patch_edge};
    const int64_t n_patches = batches * batch;
    const DatasetInfo info = [&] {
      H5Dataset d = H5Dataset::open(file, "bench_reader --file");
      return d.info();
    }();
    if (info.kind != SampleKind::kVolumes) {
      std::fprintf(
          stderr,
          "bench_reader: bad argument: '%s' holds %s, not /volumes\n",
          file.c_str(),
          to_string(info.kind));
      throw Exit{2};
    }
    const auto& sh = info.sample_shape;  // C, D, H, W
    if (patch_edge > sh[1] || patch_edge > sh[2] || patch_edge > sh[3]) {
      std::fprintf(
          stderr,
          "bench_reader: bad argument: --patch %ld is larger than the "
          "volumes [%ld, %ld, %ld]\n",
          static_cast<long>(patch_edge),
          static_cast<long>(sh[1]),
          static_cast<long>(sh[2]),
          static_cast<long>(sh[3]));
      throw Exit{2};
    }
    const int64_t C = sh[0];
    const int64_t N = info.num_samples;
    const int64_t vox = info.voxels();
    const int64_t pvox = patch_edge * patch_edge * patch_edge;
    const size_t mask_size = stored_element_size(file, "masks");
    MT_CHECK(mask_size > 0, "cannot read the type of '", file, "' /masks");
    const double patch_bytes =
        static_cast<double>(C * pvox * 4 + pvox * int64_t(mask_size));
    const double volume_bytes =
        static_cast<double>(C * vox * 4 + vox * int64_t(mask_size));
    const int64_t file_size =
        static_cast<int64_t>(std::filesystem::file_size(file));

    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    const int nproc = sched_getaffinity(0, sizeof cpus, &cpus) == 0
                          ? CPU_COUNT(&cpus)
                          : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
    hbool_t threadsafe = 0;
    H5is_library_threadsafe(&threadsafe);
    std::string chunk_text = "contiguous";
    if (!info.chunk_shape.empty()) {
      chunk_text.clear();
      for (size_t i = 0; i < info.chunk_shape.size(); ++i)
        chunk_text += (i ? "x" : "") + std::to_string(info.chunk_shape[i]);
    }
    std::printf(
        "# machine: nproc %d (online %ld), HDF5 %s, thread-safe HDF5: %s\n",
        nproc,
        sysconf(_SC_NPROCESSORS_ONLN),
        hdf5_library_version().c_str(),
        threadsafe ? "yes (reads of one file are serialised by its global "
                     "lock)"
                   : "no");
    std::printf(
        "# file: %s, %.1f MiB on %s; /volumes %ld x [%ld, %ld, %ld, %ld] %s, "
        "chunk [%s], /masks %zu B/voxel\n",
        file.c_str(),
        file_size / 1048576.0,
        fs_type(file).c_str(),
        static_cast<long>(N),
        static_cast<long>(sh[0]),
        static_cast<long>(sh[1]),
        static_cast<long>(sh[2]),
        static_cast<long>(sh[3]),
        info.sample_dtype.c_str(),
        chunk_text.c_str(),
        mask_size);
    {
      H5Dataset d = H5Dataset::open(file, "bench_reader --file");
      const std::string warn = d.patch_layout_warning(patch);
      if (!warn.empty())
        std::printf("# layout warning: %s\n", warn.c_str());
    }
    std::printf(
        "# run: patch %ld^3 (%.2f MB with its mask), %ld patches/micro-batch, "
        "%ld micro-batches (%ld patches, %.1f MB) per configuration, %ld "
        "micro-batches/window, pos_fraction 0.5, seed %lu, repeat %ld "
        "(median), simulated steps %s, step-ms %.0f\n",
        static_cast<long>(patch_edge),
        patch_bytes / 1e6,
        static_cast<long>(batch),
        static_cast<long>(batches),
        static_cast<long>(n_patches),
        n_patches * patch_bytes / 1e6,
        static_cast<long>(window),
        static_cast<unsigned long>(seed),
        static_cast<long>(repeat),
        spin ? "busy-wait" : "sleep",
        step_ms);

    // --- page cache -----------------------------------------------------
    const double before = resident_fraction(file);
    int64_t warm_bytes = 0;
    const double warm_s = read_whole_file(file, warm_bytes);
    const double after = resident_fraction(file);
    std::printf(
        "# page cache: %.0f%% of the file was resident before the warm-up%s\n",
        100.0 * before,
        before >= 0.99   ? " (in the page cache)"
        : before <= 0.01 ? " (not in the page cache)"
                         : " (partly in the page cache)");
    std::printf(
        "# warm-up: read the whole file once with read() (%.1f MB in %.3f s, "
        "%.0f MB/s); now %.0f%% resident: %s\n",
        warm_bytes / 1e6,
        warm_s,
        warm_bytes / 1e6 / warm_s,
        100.0 * after,
        cold ? "--cold evicts it before every timed run (posix_fadvise "
               "DONTNEED)"
             : "every configuration below reads from the same warm page cache");
    auto prepare_cache = [&] {
      if (cold)
        evict(file);
    };
    if (cold) {
      evict(file);
      std::printf(
          "# cold: after eviction %.0f%% of the file is resident\n",
          100.0 * resident_fraction(file));
    }

    // --- the samples: the same for every configuration --------------------
    const int64_t per_volume = (n_patches + N - 1) / N;
    std::vector<int64_t> order(N * per_volume);
    std::iota(order.begin(), order.end(), 0);
    std::mt19937_64 rng(seed);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<Window> windows;
    for (int64_t b = 0; b < batches; ++b) {
      if (b % window == 0)
        windows.emplace_back();
      windows.back().emplace_back(
          order.begin() + b * batch, order.begin() + (b + 1) * batch);
    }

    // --- correctness: prefetched == read in place ------------------------
    {
      Opened o(file, patch, per_volume, seed);
      const int64_t t =
          *std::max_element(thread_list.begin(), thread_list.end());
      const int64_t d = *std::max_element(depth_list.begin(), depth_list.end());
      Prefetcher p(o.source, d, t);
      p.expect(0, windows[0]);
      Batch a = p.load(0, windows[0][0]);
      Batch b = o.source.allocate(batch, false);
      o.source.read(0, windows[0][0], b);
      if (!torch::equal(a.x, b.x) || !torch::equal(a.y, b.y)) {
        std::fprintf(
            stderr,
            "bench_reader: check failed: the first batch from the "
            "prefetcher (%ld threads, depth %ld) differs from the same batch "
            "read in place\n",
            static_cast<long>(t),
            static_cast<long>(d));
        throw Exit{1};
      }
      std::printf(
          "# check: first prefetched batch (%ld threads, depth %ld, %ld "
          "misses) equals the same batch read in place\n",
          static_cast<long>(t),
          static_cast<long>(d),
          static_cast<long>(p.misses()));
    }

    nlohmann::json rows = nlohmann::json::array();

    // --- baseline: sequential whole-volume reads of the same bytes --------
    {
      std::vector<float> x(C * vox);
      std::vector<int64_t> y(vox);
      const double target = n_patches * patch_bytes;
      std::vector<std::pair<double, double>> runs;  // seconds, bytes
      for (int64_t r = 0; r < repeat; ++r) {
        prepare_cache();
        auto o = std::make_unique<H5Dataset>(
            H5Dataset::open(file, "bench_reader --file"));
        double secs = 0, bytes = 0;
        for (int64_t v = 0; bytes < target; ++v) {
          if (v == N) {  // wrap: a fresh chunk cache, not timed
            o = std::make_unique<H5Dataset>(
                H5Dataset::open(file, "bench_reader --file"));
            v = 0;
          }
          const auto t0 = Clock::now();
          o->read({v}, x.data(), y.data());
          secs += seconds_since(t0);
          bytes += volume_bytes;
        }
        runs.emplace_back(secs, bytes);
      }
      std::sort(runs.begin(), runs.end());
      const auto [secs, bytes] = runs[runs.size() / 2];
      const double mbs = bytes / 1e6 / secs;
      const double pps = bytes / patch_bytes / secs;
      std::printf(
          "# sequential: %.0f whole volumes in file order (H5Dataset::read, "
          "%.1f MB) in %.3f s: %.0f MB/s, %.1f patch-equivalents/s\n",
          bytes / volume_bytes,
          bytes / 1e6,
          secs,
          mbs,
          pps);
      rows.push_back(
          {{"config", "sequential"},
           {"bytes", bytes},
           {"wall_s", secs},
           {"mb_per_s", mbs},
           {"patch_equivalents_per_s", pps},
           {"cold", cold}});
    }
    const double seq_mbs = rows.back()["mb_per_s"].get<double>();

    // --- the configurations ------------------------------------------------
    std::vector<std::pair<int64_t, int64_t>> configs = {{0, 0}};
    for (int64_t t : thread_list)
      for (int64_t d : depth_list)
        configs.emplace_back(t, d);
    std::printf(
        "# %7s %7s %5s %8s %9s %8s %7s %9s %9s %9s %6s %6s\n",
        "compute",
        "threads",
        "depth",
        "wall_s",
        "patches/s",
        "MB/s",
        "vs_seq",
        "wait_s",
        "wait/win",
        "max/win",
        "waits",
        "misses");
    for (int64_t compute : compute_list) {
      for (const auto& [t, d] : configs) {
        std::vector<Measure> runs;
        for (int64_t r = 0; r < repeat; ++r) {
          Opened o(file, patch, per_volume, seed);
          prepare_cache();
          runs.push_back(run_once(
              o.source,
              t,
              d,
              static_cast<double>(compute),
              step_ms,
              spin,
              windows));
        }
        std::sort(runs.begin(), runs.end(), [](const auto& a, const auto& b) {
          return a.wall_s < b.wall_s;
        });
        const Measure& m = runs[runs.size() / 2];
        const double pps = n_patches / m.wall_s;
        const double mbs = n_patches * patch_bytes / 1e6 / m.wall_s;
        std::printf(
            "  %7ld %7ld %5ld %8.3f %9.1f %8.0f %6.2fx %9.3f %7.1fms "
            "%7.1fms %3ld/%-2ld %6ld\n",
            static_cast<long>(compute),
            static_cast<long>(t),
            static_cast<long>(d),
            m.wall_s,
            pps,
            mbs,
            mbs / seq_mbs,
            m.wait_s,
            m.wait_mean_ms,
            m.wait_max_ms,
            static_cast<long>(m.windows_waiting),
            static_cast<long>(windows.size()),
            static_cast<long>(m.misses));
        std::fflush(stdout);
        rows.push_back(
            {{"config", t == 0 ? "in_place" : "prefetch"},
             {"compute_ms", compute},
             {"step_ms", step_ms},
             {"threads", t},
             {"depth", d},
             {"patches", n_patches},
             {"wall_s", m.wall_s},
             {"patches_per_s", pps},
             {"mb_per_s", mbs},
             {"vs_sequential", mbs / seq_mbs},
             {"wait_s", m.wait_s},
             {"wait_per_window_ms_mean", m.wait_mean_ms},
             {"wait_per_window_ms_max", m.wait_max_ms},
             {"windows", windows.size()},
             {"windows_waiting", m.windows_waiting},
             {"misses", m.misses},
             {"cold", cold}});
      }
    }
    std::printf(
        "# columns: compute = simulated step per micro-batch (ms); MB/s and "
        "vs_seq = patch bytes per wall second, and against the sequential "
        "read; wait_s = time blocked in Prefetcher::load() in total, "
        "wait/win and max/win per window; waits = windows blocked > 1 ms; "
        "misses = batches read in place on the training thread\n");
    std::printf("# total run time %.1f s\n", seconds_since(t_total));
    const nlohmann::json common = {
        {"file_bytes", file_size},
        {"patch", patch_edge},
        {"batch", batch},
        {"window", window},
        {"nproc", nproc},
        {"hdf5", hdf5_library_version()},
        {"hdf5_threadsafe", threadsafe != 0},
        {"chunk", info.chunk_shape}};
    for (auto& row : rows) {
      row.update(common);
      std::printf("json: %s\n", row.dump().c_str());
    }
  } catch (const Exit& e) {
    rc = e.rc;  // the message is printed
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_reader: error: %s\n", e.what());
    rc = 1;
  }
  if (!dir.empty())
    std::filesystem::remove_all(dir);
  return rc;
}
