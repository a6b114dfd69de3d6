#include "bench_common.h"

#include <mpi.h>
#include <torch/version.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>

#include "memtrain/dist/cpu_threads.h"
#include "memtrain/util/clock.h"

namespace memtrain::bench {
namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

std::string mpi_library() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string s(text, static_cast<size_t>(len));
  return s.substr(0, s.find_first_of(",\n"));
}

}  // namespace

std::string header(const std::string& name) {
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  const BlasInfo blas = loaded_blas();
  std::ostringstream out;
  out << "# " << name << ": " << date << " on " << host_name() << ", "
      << cpu_model() << ", " << sysconf(_SC_NPROCESSORS_ONLN)
      << " CPUs online (" << affinity_cpus().size()
      << " in this process's mask)\n# LibTorch " << TORCH_VERSION << ", "
      << mpi_library() << ", BLAS "
      << (blas.library.empty() ? "none loaded" : blas.library);
  return out.str();
}

bool plot(const std::string& script) {
  FILE* p = popen("gnuplot 2>&1", "w");
  if (!p) {
    std::fprintf(stderr, "plot: cannot start gnuplot; PNG not drawn\n");
    return false;
  }
  std::fputs(script.c_str(), p);
  const int rc = pclose(p);
  if (rc != 0) {
    std::fprintf(
        stderr,
        "plot: gnuplot failed (status %d; is gnuplot-nox installed?); PNG "
        "not drawn\n",
        rc);
    return false;
  }
  return true;
}

}  // namespace memtrain::bench
