#pragma once
// What every benchmark prints and writes: a header naming the machine and
// the library versions, CSV, and a PNG drawn by gnuplot when it is found.

#include <string>
#include <vector>

#include "memtrain/train/logs/metrics.h"

namespace memtrain::bench {

// "# <name>: <date> on <host>, <cpu model>, <n> CPUs online (<m> in this
// process's mask); LibTorch x, <MPI library>, BLAS <path>". Rank-local
// facts; print it from rank 0.
std::string header(const std::string& name);

// Runs gnuplot on `script` (which must `set output` itself). Returns false,
// printing why on stderr, when gnuplot is missing or fails: the CSV stands
// on its own.
bool plot(const std::string& script);

// CSV quoting for one field (metrics.csv's).
using memtrain::csv_field;

}  // namespace memtrain::bench
