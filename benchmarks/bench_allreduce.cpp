// bench_allreduce: memtrain's communicator against the raw library call on
// the same buffers, in the same run, and the bucketed gradient sync of the
// real models against one flat buffer of the same bytes.
//
//   mpirun -np 2 bench_allreduce [--min-bytes 8] [--max-bytes 1073741824]
//       [--rounds 3] [--models mlp,cnn,unet3d]
//       [--buckets-mib 1,2,5,10,25,50,100] [--device cpu|cuda]
//       [--csv PREFIX] [--png PREFIX]
//
// Part 1, sizes from --min-bytes to --max-bytes in x2 steps (bounded by
// MemAvailable / (4 x ranks on the node)): a float32 buffer all-reduced
// (sum, in place) by the raw call (MPI_Allreduce; ncclAllReduce with
// --device cuda on a CUDA build) and by memtrain's Communicator
// (all_reduce_sum: MPI_Iallreduce and polling; NCCL on its own stream), in
// alternating blocks, --rounds times; per block the slowest rank's time per
// call; the median block. algbw = bytes / time, busbw = algbw x 2(n-1)/n
// (nccl-tests' definition: what each link carries). PREFIX.sizes.csv and
// PREFIX.sizes.png (busbw against size).
//
// Part 2, per model: its gradient in GradientSync buckets of each size of
// --buckets-mib, one sync() per call, against one all_reduce_sum of a flat
// buffer of the same bytes (memtrain and raw). PREFIX.buckets.csv and
// PREFIX.buckets.png.
//
// Every size is checked: a buffer of ones sums to the world size.

#include <mpi.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.h"
#include "memtrain/dist/cpu_threads.h"
#include "memtrain/dist/environment.h"
#include "memtrain/dist/gradient_sync.h"
#include "memtrain/dist/make_communicator.h"
#include "memtrain/dist/mpi_communicator.h"
#include "memtrain/model/models.h"
#include "memtrain/model/registry.h"
#include "memtrain/util/clock.h"
#include "memtrain/util/error.h"

#if MEMTRAIN_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>
#endif

using namespace memtrain;

namespace {

struct Setup {
  int rank = 0, world = 1;
  bool cuda = false;
  torch::Device device = torch::kCPU;
  Communicator* comm = nullptr;
  std::function<void(float*, int64_t)> raw;  // the library call
  std::string raw_name;
  std::string mt_path;  // how memtrain's sums travelled (after the sweep)
  std::function<void()> sync_device = [] {};
};

// Median over rounds of the slowest rank's mean time per call.
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double slowest(double seconds) {
  double out = 0;
  MPI_Allreduce(&seconds, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

double time_block(
    const Setup& s, int64_t iters, const std::function<void()>& op) {
  s.sync_device();
  MPI_Barrier(MPI_COMM_WORLD);
  const Clock::time_point t0 = Clock::now();
  for (int64_t i = 0; i < iters; ++i)
    op();
  s.sync_device();
  return slowest(seconds_since(t0) / static_cast<double>(iters));
}

double bus_factor(int world) {
  return world > 1 ? 2.0 * (world - 1) / world : 0.0;
}

int64_t memory_bound(int64_t asked) {
  std::ifstream in("/proc/meminfo");
  int64_t available_kib = 0;
  for (std::string key; in >> key;) {
    int64_t v = 0;
    std::string unit;
    in >> v >> unit;
    if (key == "MemAvailable:")
      available_kib = v;
  }
  MPI_Comm node;
  MPI_Comm_split_type(
      MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 1;
  MPI_Comm_size(node, &local);
  MPI_Comm_free(&node);
  int64_t bound = available_kib * 1024 / (4 * local);
  MPI_Allreduce(MPI_IN_PLACE, &bound, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
  return std::min(asked, bound);
}

bool check_sum(const Setup& s, torch::Tensor& buf, bool raw) {
  buf.fill_(1.0f);
  if (raw)
    s.raw(buf.data_ptr<float>(), buf.numel());
  else
    s.comm->all_reduce_sum(buf);
  s.sync_device();
  const auto bad =
      (buf - static_cast<float>(s.world)).abs().max().item<double>();
  return bad == 0.0;
}

struct SizeRow {
  int64_t bytes = 0, iters = 0;
  double raw_s = 0, mt_s = 0;
};

std::vector<SizeRow> sweep_sizes(
    const Setup& s, int64_t min_bytes, int64_t max_bytes, int rounds) {
  std::vector<SizeRow> rows;
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const int64_t n = std::max<int64_t>(1, bytes / 4);
    auto buf = torch::ones({n}, torch::dtype(torch::kFloat32).device(s.device));
    MT_CHECK(
        check_sum(s, buf, true) && check_sum(s, buf, false),
        "all-reduce of ",
        bytes,
        " bytes gave a wrong sum");
    // About 64 MiB moved per block, at least 3 and at most 1000 calls.
    SizeRow row;
    row.bytes = n * 4;
    row.iters = std::clamp<int64_t>((64 << 20) / row.bytes, 3, 1000);
    float* p = buf.data_ptr<float>();
    auto raw = [&] { s.raw(p, n); };
    auto mine = [&] { s.comm->all_reduce_sum(buf); };
    raw();  // warm-up: the library's first call sets up its paths
    mine();
    std::vector<double> r, m;
    for (int k = 0; k < rounds; ++k) {
      r.push_back(time_block(s, row.iters, raw));
      m.push_back(time_block(s, row.iters, mine));
    }
    row.raw_s = median(r);
    row.mt_s = median(m);
    rows.push_back(row);
  }
  return rows;
}

struct ModelSpec {
  std::string name;
  ModelConfig cfg;
  ModelInput input;
};

ModelSpec model_spec(const std::string& name) {
  ModelSpec m;
  m.name = name;
  const std::optional<ModelName> model = parse_choice<ModelName>(name);
  m.cfg.name = model.value_or(ModelName::kMlp);
  if (model ==
      ModelName::kMlp) {  // matrix products dominate: width 1024, 4 blocks
    m.cfg.hidden = 1024;
    m.cfg.depth = 4;
    m.input = {SampleKind::kFeatures, {256}, 10, 0};
  } else if (model == ModelName::kCnn) {  // launch/configs/images.yaml
    m.cfg.hidden = 16;
    m.input = {SampleKind::kImages, {3, 32, 32}, 10, 0};
  } else if (model == ModelName::kUnet3d) {  // the seed-001 U-Net: feature_size
                                             // 48
    m.cfg.feature_size = 48;
    m.cfg.depth = 4;
    m.cfg.norm = Norm::kInstance;
    m.input = {SampleKind::kVolumes, {1, 96, 96, 96}, 2, 0};
  } else {
    throw Error("--models: unknown model '" + name + "' (mlp, cnn, unet3d)");
  }
  return m;
}

struct BucketRow {
  std::string model;
  int64_t grad_bytes = 0, buckets = 0, iters = 0;
  double bucket_mib = 0, sync_s = 0, flat_s = 0, raw_flat_s = 0;
};

std::vector<BucketRow> sweep_buckets(
    const Setup& s,
    const std::vector<std::string>& models,
    const std::vector<double>& buckets_mib,
    int rounds) {
  std::vector<BucketRow> rows;
  for (const auto& name : models) {
    const ModelSpec spec = model_spec(name);
    auto model = make_model(spec.cfg, spec.input);
    model->to(s.device);
    std::vector<at::Tensor> params;
    for (auto& p : model->parameters())
      params.push_back(p);
    for (double mib : buckets_mib) {
      GradientSync sync(
          *s.comm, params, static_cast<int64_t>(mib * 1048576.0), 0);
      BucketRow row;
      row.model = name;
      row.bucket_mib = mib;
      row.buckets = sync.num_buckets();
      row.grad_bytes = sync.bytes_per_sync();
      row.iters = std::clamp<int64_t>((256 << 20) / row.grad_bytes, 3, 200);
      auto flat = torch::zeros(
          {row.grad_bytes / 4}, torch::dtype(torch::kFloat32).device(s.device));
      auto bucketed = [&] {
        sync.attach();
        sync.sync(at::Tensor());
      };
      auto one = [&] { s.comm->all_reduce_sum(flat); };
      auto raw = [&] { s.raw(flat.data_ptr<float>(), flat.numel()); };
      bucketed();
      one();
      std::vector<double> b, f, r;
      for (int k = 0; k < rounds; ++k) {
        b.push_back(time_block(s, row.iters, bucketed));
        f.push_back(time_block(s, row.iters, one));
        r.push_back(time_block(s, row.iters, raw));
      }
      row.sync_s = median(b);
      row.flat_s = median(f);
      row.raw_flat_s = median(r);
      rows.push_back(row);
    }
  }
  return rows;
}

template <typename T>
std::vector<T> split_list(const std::string& text) {
  std::vector<T> out;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.empty())
      continue;
    std::istringstream v(item);
    T x{};
    v >> x;
    out.push_back(x);
  }
  return out;
}

void report_sizes(
    const Setup& s,
    const std::vector<SizeRow>& rows,
    const std::string& csv,
    const std::string& png) {
  const double bf = bus_factor(s.world);
  std::printf(
      "\n# part 1: all-reduce (sum, float32, in place), %d rank(s); time: "
      "median of the slowest rank's mean per call\n",
      s.world);
  std::printf(
      "%12s %6s %12s %12s %11s %11s %9s\n",
      "bytes",
      "iters",
      "raw_us",
      "memtrain_us",
      "raw_busbw",
      "mt_busbw",
      "mt/raw");
  std::ofstream out(csv);
  out << "ranks,bytes,iters,raw_call,raw_us,raw_algbw_gbs,raw_busbw_gbs,"
         "memtrain_"
         "path,memtrain_us,memtrain_algbw_gbs,memtrain_busbw_gbs,memtrain_"
         "over_raw_busbw\n";
  for (const auto& r : rows) {
    const double ra = r.bytes / r.raw_s / 1e9, ma = r.bytes / r.mt_s / 1e9;
    const double ratio = r.raw_s / r.mt_s;  // busbw ratio = time ratio
    std::printf(
        "%12lld %6lld %12.2f %12.2f %11.3f %11.3f %9.3f\n",
        static_cast<long long>(r.bytes),
        static_cast<long long>(r.iters),
        r.raw_s * 1e6,
        r.mt_s * 1e6,
        ra * bf,
        ma * bf,
        ratio);
    out << s.world << "," << r.bytes << "," << r.iters << ","
        << bench::csv_field(s.raw_name) << "," << r.raw_s * 1e6 << "," << ra
        << "," << ra * bf << ","
        << bench::csv_field("Communicator(" + s.mt_path + ")") << ","
        << r.mt_s * 1e6 << "," << ma << "," << ma * bf << "," << ratio << "\n";
  }
  out.close();
  std::printf("# busbw in GB/s (algbw x 2(n-1)/n); CSV %s\n", csv.c_str());
  if (s.world > 1 &&
      bench::plot(
          "set terminal pngcairo size 900,540\nset output '" + png +
          "'\nset datafile separator ','\nset logscale x 2\nset key top "
          "left\nset xlabel 'message bytes'\nset ylabel 'bus bandwidth "
          "(GB/s)'\nset title 'all-reduce, " +
          std::to_string(s.world) + " ranks'\nplot '" + csv +
          "' every ::1 using 2:7 with linespoints title 'raw " + s.raw_name +
          "', '' every ::1 using 2:11 with linespoints title 'memtrain'\n"))
    std::printf("# plot %s\n", png.c_str());
}

void report_buckets(
    const Setup& s,
    const std::vector<BucketRow>& rows,
    const std::string& csv,
    const std::string& png) {
  std::printf(
      "\n# part 2: one gradient sync of each model, bucketed (GradientSync) "
      "against one flat buffer of the same bytes\n");
  std::printf(
      "%-8s %9s %10s %8s %10s %10s %12s %9s\n",
      "model",
      "grad_MiB",
      "bucket_MiB",
      "buckets",
      "sync_ms",
      "flat_ms",
      "raw_flat_ms",
      "sync/flat");
  std::ofstream out(csv);
  out << "model,grad_bytes,bucket_mib,buckets,iters,sync_ms,flat_ms,raw_flat_"
         "ms,sync_over_flat\n";
  for (const auto& r : rows) {
    std::printf(
        "%-8s %9.2f %10.1f %8lld %10.3f %10.3f %12.3f %9.3f\n",
        r.model.c_str(),
        r.grad_bytes / 1048576.0,
        r.bucket_mib,
        static_cast<long long>(r.buckets),
        r.sync_s * 1e3,
        r.flat_s * 1e3,
        r.raw_flat_s * 1e3,
        r.sync_s / r.flat_s);
    out << r.model << "," << r.grad_bytes << "," << r.bucket_mib << ","
        << r.buckets << "," << r.iters << "," << r.sync_s * 1e3 << ","
        << r.flat_s * 1e3 << "," << r.raw_flat_s * 1e3 << ","
        << r.sync_s / r.flat_s << "\n";
  }
  out.close();
  std::printf("# CSV %s\n", csv.c_str());
  if (s.world > 1 && !rows.empty() &&
      bench::plot(
          "set terminal pngcairo size 900,540\nset output '" + png +
          "'\nset datafile separator ','\nset logscale x\nset key top "
          "right\nset xlabel 'bucket size (MiB)'\nset ylabel 'bucketed sync "
          "/ one flat all-reduce'\nset title 'gradient sync, " +
          std::to_string(s.world) + " ranks'\nplot for [m in '" +
          [&] {
            std::string names;
            for (const auto& r : rows)
              if (names.find(r.model) == std::string::npos)
                names += (names.empty() ? "" : " ") + r.model;
            return names;
          }() +
          "'] '" + csv +
          "' every ::1 using (strcol(1) eq m ? $3 : NaN):9 with "
          "linespoints title m\n"))
    std::printf("# plot %s\n", png.c_str());
}

}  // namespace

int run(Environment& env, int argc, char** argv);

int main(int argc, char** argv) {
  Environment env(&argc, &argv);
  try {
    return run(env, argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_allreduce: error: %s\n", e.what());
    env.abort(1);
  }
}

int run(Environment& env, int argc, char** argv) {
  CLI::App app("bench_allreduce");
  int64_t min_bytes = 8, max_bytes = int64_t{1} << 30;
  int rounds = 3;
  std::string models = "mlp,cnn,unet3d", buckets = "1,2,5,10,25,50,100";
  std::string device = "cpu", csv = "bench_allreduce", png;
  app.add_option("--min-bytes", min_bytes);
  app.add_option("--max-bytes", max_bytes);
  app.add_option("--rounds", rounds)->check(CLI::PositiveNumber);
  app.add_option("--models", models, "comma list; '' skips part 2");
  app.add_option("--buckets-mib", buckets);
  app.add_option("--device", device)->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--csv", csv, "prefix of the CSV files");
  app.add_option("--png", png, "prefix of the plots (default: --csv's)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (png.empty())
    png = csv;
  configure_cpu_threads(env);

  Setup s;
  s.rank = env.rank();
  s.world = env.world_size();
  CommunicatorSpec spec;
  std::unique_ptr<Communicator> comm;
#if MEMTRAIN_CUDA
  ncclComm_t raw_nccl = nullptr;
  if (device == "cuda") {
    s.cuda = true;
    // The GPU of this local rank modulo the GPUs visible, as the trainer's
    // Placement::choose picks it.
    const int gpus = static_cast<int>(torch::cuda::device_count());
    MT_CHECK(
        gpus > 0,
        "bench_allreduce --device cuda: LibTorch sees no CUDA device "
        "(check nvidia-smi and CUDA_VISIBLE_DEVICES)");
    const int gpu = env.local_rank() % gpus;
    s.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(gpu));
    const cudaError_t set = cudaSetDevice(gpu);
    MT_CHECK(
        set == cudaSuccess,
        "bench_allreduce: cudaSetDevice(",
        gpu,
        ") failed: ",
        cudaGetErrorString(set));
    spec.backend = BackendChoice::kNccl;
    spec.cuda_device = true;
    spec.device_index = gpu;
    auto nccl_check = [&s](ncclResult_t rc, const char* what) {
      MT_CHECK(
          rc == ncclSuccess,
          "bench_allreduce: [rank ",
          s.rank,
          "] ",
          what,
          " failed: ",
          ncclGetErrorString(rc),
          " (NCCL_DEBUG=INFO says more)");
    };
    ncclUniqueId id;
    if (s.rank == 0)
      nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    nccl_check(
        ncclCommInitRank(&raw_nccl, s.world, id, s.rank),
        "ncclCommInitRank of the raw NCCL communicator");
    s.raw_name = "ncclAllReduce";
    s.raw = [&s, &raw_nccl, nccl_check](float* p, int64_t n) {
      auto stream = c10::cuda::getCurrentCUDAStream(s.device.index());
      nccl_check(
          ncclAllReduce(p, p, n, ncclFloat, ncclSum, raw_nccl, stream.stream()),
          "ncclAllReduce");
    };
    s.sync_device = [] { cudaDeviceSynchronize(); };
  }
#else
  if (device == "cuda") {
    if (s.rank == 0)
      std::fprintf(
          stderr,
          "bench_allreduce: --device cuda needs a CUDA build "
          "(-DMEMTRAIN_CUDA=ON)\n");
    return 2;
  }
#endif
  if (!s.cuda) {
    s.raw_name = "MPI_Allreduce";
    s.raw = [](float* p, int64_t n) {
      MPI_Allreduce(
          MPI_IN_PLACE,
          p,
          static_cast<int>(n),
          MPI_FLOAT,
          MPI_SUM,
          MPI_COMM_WORLD);
    };
  }
  comm = make_communicator(MPI_COMM_WORLD, spec);
  s.comm = comm.get();

  const int64_t bound = s.cuda ? max_bytes : memory_bound(max_bytes);
  if (s.rank == 0) {
    std::printf("%s\n", bench::header("bench_allreduce").c_str());
    std::printf(
        "# %d rank(s) on %s, device %s, raw call %s, memtrain %s backend; "
        "%d round(s) of alternating blocks\n",
        s.world,
        env.nodes().describe().c_str(),
        device.c_str(),
        s.raw_name.c_str(),
        to_string(comm->backend()),
        rounds);
    if (bound < max_bytes)
      std::printf(
          "# sizes above %lld bytes skipped: MemAvailable / (4 x ranks on "
          "this node)\n",
          static_cast<long long>(bound));
  }
  const auto sizes = sweep_sizes(s, min_bytes, bound, rounds);
  const auto* mpi = dynamic_cast<const MpiCommunicator*>(comm.get());
  s.mt_path = mpi ? mpi->sum_path() : "nccl";
  if (s.rank == 0) {
    std::printf(
        "# memtrain's sums of 64 KiB and more: %s\n", s.mt_path.c_str());
    report_sizes(s, sizes, csv + ".sizes.csv", png + ".sizes.png");
  }
  const auto rows = sweep_buckets(
      s, split_list<std::string>(models), split_list<double>(buckets), rounds);
  if (s.rank == 0 && !rows.empty())
    report_buckets(s, rows, csv + ".buckets.csv", png + ".buckets.png");
#if MEMTRAIN_CUDA
  comm.reset();
  if (raw_nccl)
    ncclCommDestroy(raw_nccl);
#endif
  return 0;
}
