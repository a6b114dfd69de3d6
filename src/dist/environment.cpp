#include "memtrain/dist/environment.h"

#include <elf.h>
#include <link.h>
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <string>

#include "memtrain/util/clock.h"
#include "memtrain/util/error.h"
#include "memtrain/util/file_digest.h"

namespace memtrain {
namespace {

int parse_int(const char* name, const char* text) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  MT_CHECK(
      end != text && v >= 0 && v < (1 << 24),
      "environment variable ",
      name,
      "='",
      text,
      "' is not a non-negative integer");
  return static_cast<int>(v);
}

}  // namespace

int slurm_tasks_on_node(const std::string& text, int node_id) {
  auto bad = [&](const std::string& why) {
    return Error(detail::concat(
        "SLURM_TASKS_PER_NODE='",
        text,
        "' ",
        why,
        " (SLURM writes counts per node such as 2(x2),1; was it set by "
        "hand?)"));
  };
  // The whole value is checked, not only the entries up to this node.
  std::vector<int> counts;
  size_t at = 0;
  while (at <= text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos)
      end = text.size();
    const std::string item = text.substr(at, end - at);
    static const std::regex entry("([0-9]{1,7})(\\(x([0-9]{1,7})\\))?");
    std::smatch m;
    if (!std::regex_match(item, m, entry))
      throw bad("has an entry '" + item + "' that is not C or C(xR)");
    const int count = std::stoi(m[1].str());
    const int repeat = m[3].matched ? std::stoi(m[3].str()) : 1;
    if (count < 1 || repeat < 1)
      throw bad("has an entry '" + item + "' below 1");
    if (counts.size() + static_cast<size_t>(repeat) > (size_t{1} << 20))
      throw bad("lists more than 2^20 nodes");
    counts.insert(counts.end(), static_cast<size_t>(repeat), count);
    at = end + 1;
  }
  if (node_id >= static_cast<int>(counts.size()))
    throw bad(detail::concat(
        "lists ",
        counts.size(),
        " node(s), and this is node ",
        node_id,
        " (SLURM_NODEID)"));
  return counts[static_cast<size_t>(node_id)];
}

namespace {

// The GNU build id the linker wrote into the running executable (a hash of
// its contents, .note.gnu.build-id; Debian's gcc links with --build-id),
// as hex; "" when it has none.
int find_build_id(struct dl_phdr_info* info, size_t, void* out) {
  auto* id = static_cast<std::string*>(out);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE)
      continue;
    const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
    const char* end = p + ph.p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      const auto* note = reinterpret_cast<const ElfW(Nhdr)*>(p);
      const char* name = p + sizeof(ElfW(Nhdr));
      const char* desc = name + ((note->n_namesz + 3) & ~3u);
      if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 &&
          std::memcmp(name, "GNU", 4) == 0) {
        static const char* hex = "0123456789abcdef";
        for (unsigned k = 0; k < note->n_descsz; ++k) {
          const auto byte = static_cast<unsigned char>(desc[k]);
          *id += hex[byte >> 4];
          *id += hex[byte & 15];
        }
        return 1;
      }
      p = desc + ((note->n_descsz + 3) & ~3u);
    }
  }
  return 1;  // the first object is the executable: stop there
}

}  // namespace

std::string executable_identity() {
  std::string id;
  dl_iterate_phdr(find_build_id, &id);
  if (!id.empty())
    return "memtrain 0.1.0, build id " + id;
  // No build id (another linker's choice): the whole file's digest.
  return "memtrain 0.1.0, " + file_digest("/proc/self/exe", /*whole=*/true);
}

void check_same_on_every_rank(
    const Environment& env,
    const std::string& mine,
    const std::string& subject,
    const std::string& verb,
    const std::string& fix) {
  const auto all = env.all_gather(mine);
  std::vector<std::string> values;
  std::vector<std::vector<int>> ranks;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    const size_t v = static_cast<size_t>(
        std::find(values.begin(), values.end(), all[r]) - values.begin());
    if (v == values.size()) {
      values.push_back(all[r]);
      ranks.emplace_back();
    }
    ranks[v].push_back(r);
  }
  if (values.size() == 1)
    return;
  std::string what;
  for (size_t v = 0; v < values.size(); ++v)
    what += detail::concat(
        v ? "; " : "",
        env.nodes().name_ranks(ranks[v]),
        " ",
        verb,
        " ",
        values[v]);
  throw Error(detail::concat(subject, ": ", what, ". ", fix));
}

void check_same_build(const Environment& env) {
  check_same_on_every_rank(
      env,
      executable_identity(),
      "the ranks run different builds of memtrain",
      "run",
      "Install the same memtrain on every node (one build on a shared "
      "folder, or the same package), then start again");
}

NodeLayout node_layout(const std::vector<std::string>& host_by_rank) {
  NodeLayout out;
  out.hosts = host_by_rank;
  std::vector<std::string> names;
  for (const auto& h : host_by_rank) {
    const auto it = std::find(names.begin(), names.end(), h);
    const int node = static_cast<int>(it - names.begin());
    if (it == names.end()) {
      names.push_back(h);
      out.ranks_per_node.push_back(0);
    }
    out.node_of_rank.push_back(node);
    out.ranks_per_node[static_cast<size_t>(node)] += 1;
  }
  return out;
}

std::string NodeLayout::describe() const {
  const int n = node_count();
  const bool even =
      std::all_of(ranks_per_node.begin(), ranks_per_node.end(), [&](int c) {
        return c == ranks_per_node.front();
      });
  std::string out = detail::concat(n, n == 1 ? " node" : " nodes");
  if (even) {
    const int c = ranks_per_node.front();
    return out + detail::concat(" × ", c, c == 1 ? " rank" : " ranks");
  }
  out += ": ";
  for (size_t i = 0; i < ranks_per_node.size(); ++i)
    out += (i ? "+" : "") + std::to_string(ranks_per_node[i]);
  return out + " ranks";
}

std::string NodeLayout::name_ranks(const std::vector<int>& ranks) const {
  // Hosts in node order, each with its ranks.
  std::vector<std::vector<int>> by_node(ranks_per_node.size());
  std::vector<int> unknown;
  for (int r : ranks) {
    if (r >= 0 && r < static_cast<int>(node_of_rank.size()))
      by_node[static_cast<size_t>(node_of_rank[static_cast<size_t>(r)])]
          .push_back(r);
    else
      unknown.push_back(r);
  }
  std::string out;
  auto list = [](const std::vector<int>& rs) {
    std::string s = rs.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < rs.size(); ++i)
      s += (i ? ", " : "") + std::to_string(rs[i]);
    return s;
  };
  for (size_t n = 0; n < by_node.size(); ++n) {
    if (by_node[n].empty())
      continue;
    const std::string& host = hosts[static_cast<size_t>(by_node[n].front())];
    out += (out.empty() ? "" : "; ") + list(by_node[n]) + " on " + host;
  }
  if (!unknown.empty())
    out += (out.empty() ? "" : "; ") + list(unknown);
  return out;
}

LocalRank local_rank_from_env(
    const std::function<const char*(const char*)>& getenv) {
  LocalRank out;
  // The variables the rank and the size came from, for the check below
  // (size_from "": no size given, the rank's own count is taken).
  std::string rank_from, size_from;
  const auto size_of = [&](const char* name) {
    if (const char* s = getenv(name)) {
      out.local_size = parse_int(name, s);
      size_from = std::string(name) + "=" + s;
    }
  };
  if (const char* r = getenv("OMPI_COMM_WORLD_LOCAL_RANK")) {
    out.local_rank = parse_int("OMPI_COMM_WORLD_LOCAL_RANK", r);
    rank_from = std::string("OMPI_COMM_WORLD_LOCAL_RANK=") + r;
    size_of("OMPI_COMM_WORLD_LOCAL_SIZE");
    out.source = "openmpi";
  } else if (const char* r = getenv("SLURM_LOCALID")) {
    out.local_rank = parse_int("SLURM_LOCALID", r);
    rank_from = std::string("SLURM_LOCALID=") + r;
    // The step's layout by node first: --ntasks-per-node=3 over 4 tasks
    // on 2 nodes places 3,1, and SLURM_NTASKS_PER_NODE=3 says only the
    // most a node holds.
    const char* name = "SLURM_STEP_TASKS_PER_NODE";
    const char* layout = getenv(name);
    if (!layout) {
      name = "SLURM_TASKS_PER_NODE";
      layout = getenv(name);
    }
    if (layout) {
      const char* id = getenv("SLURM_NODEID");
      const int node = id ? parse_int("SLURM_NODEID", id) : 0;
      out.local_size = slurm_tasks_on_node(layout, node);
      size_from = detail::concat(
          name, "=", layout, " (", out.local_size, " on node ", node, ")");
    } else {
      size_of("SLURM_NTASKS_PER_NODE");
    }
    out.source = "slurm";
  } else if (const char* r = getenv("LOCAL_RANK")) {
    out.local_rank = parse_int("LOCAL_RANK", r);
    rank_from = std::string("LOCAL_RANK=") + r;
    size_of("LOCAL_WORLD_SIZE");
    out.source = "torchrun";
  }
  // A rank at or beyond its node's count would share a device with
  // another rank on a GPU node: the launcher's variables contradict each
  // other (a wrapper that sets one of them?).
  MT_CHECK(
      size_from.empty() || out.local_rank < out.local_size,
      rank_from,
      " is not a node-local rank below ",
      size_from,
      ": the launcher's environment contradicts itself; launch with mpirun "
      "or srun directly, or fix the wrapper that sets these variables");
  if (out.local_size < out.local_rank + 1)
    out.local_size = out.local_rank + 1;
  return out;
}

void check_launch_world(
    int mpi_world, const std::function<const char*(const char*)>& getenv) {
  auto count = [&](const char* name) {
    const char* v = getenv(name);
    return v ? parse_int(name, v) : 0;
  };
  const std::string world = std::to_string(mpi_world);
  if (getenv("OMPI_COMM_WORLD_SIZE")) {
    const int n = count("OMPI_COMM_WORLD_SIZE");
    MT_CHECK(
        n == mpi_world,
        "mpirun started ",
        n,
        " processes (OMPI_COMM_WORLD_SIZE=",
        n,
        ") but MPI sees a world of ",
        world,
        ": memtrain was built against another MPI than the mpirun that "
        "launched it; launch with the mpirun of the MPI memtrain links "
        "(ldd memtrain | grep libmpi)");
    return;
  }
  const char* slurm =
      getenv("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
  const int n = count(slurm);
  if (n > 0) {
    MT_CHECK(
        n <= mpi_world,
        "SLURM announces ",
        n,
        " tasks (",
        slurm,
        "=",
        n,
        ") but MPI sees a world of ",
        world,
        ": without working PMI each task would train alone, ",
        n,
        " copies writing into one output.dir. Launch with srun --mpi=pmix "
        "(srun --mpi=list shows what this cluster has; "
        "launch/slurm/train.sbatch does), or through mpirun inside the "
        "allocation");
  }
  if (getenv("WORLD_SIZE") &&
      (getenv("TORCHELASTIC_RUN_ID") || getenv("LOCAL_WORLD_SIZE"))) {
    const int copies = count("WORLD_SIZE");
    MT_CHECK(
        copies <= mpi_world,
        "torchrun (or another PyTorch launcher) started ",
        copies,
        " processes (WORLD_SIZE=",
        copies,
        ") but MPI sees a world of ",
        world,
        ": memtrain's ranks are MPI processes; launch with mpirun -np ",
        copies,
        " memtrain train ... (or srun --mpi=pmix)");
  }
}

Environment::Environment(int* argc, char*** argv) {
  // A peer's socket that closes under a write (its node lost) must come
  // back to MPI as an error, so that the collective timeout names the
  // ranks that did not arrive: by default SIGPIPE ends this rank at once
  // without a word (seen under srun: "task 0: Broken pipe", status 141).
  signal(SIGPIPE, SIG_IGN);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    owns_mpi_ = true;
  }
  // Errors in MPI calls come back as codes that our check macros turn into
  // exceptions with MPI's own message, instead of MPI aborting silently.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  local_ = local_rank_from_env([](const char* n) { return std::getenv(n); });
  if (local_.source.empty()) {
    // No launcher variables: ask MPI which ranks share this node.
    MPI_Comm node;
    MPI_Comm_split_type(
        MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_.local_rank);
    MPI_Comm_size(node, &local_.local_size);
    MPI_Comm_free(&node);
    local_.source = "mpi-shared-memory";
  }
  hostname_ = host_name();
  // Every rank's host, polled against the (default) collective timeout: the
  // nodes for the banner and environment.json, and the hosts that timeout
  // messages name.
  nodes_ = node_layout(all_gather(hostname_));
  set_rank_hosts(nodes_.hosts);
}

Environment::~Environment() {
  if (owns_mpi_) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
      MPI_Finalize();
  }
}

void Environment::abort(int status) const {
  MPI_Abort(MPI_COMM_WORLD, status);
  std::_Exit(status);
}

void Environment::set_collective_timeout(double seconds) {
  waiter_.set_timeout(seconds);
}

// Both collectives below are polled against the timeout: a rank stuck
// before them (opening a file on a hung file system, say) must not hang
// the start-up. See Note [Collective timeouts].
bool Environment::all_ok(bool ok, int* first_failing_rank) const {
  const int lowest = waiter_.first_failing_rank(ok, "start-up check");
  if (first_failing_rank)
    *first_failing_rank = lowest;
  return lowest == world_size_;
}

std::vector<std::string> Environment::all_gather(
    const std::string& text) const {
  // Lengths first, then the texts: no width to truncate at.
  int length = static_cast<int>(text.size());
  std::vector<int> lengths(world_size_);
  MPI_Request request;
  MT_MPI_CHECK(
      MPI_Iallgather(
          &length,
          1,
          MPI_INT,
          lengths.data(),
          1,
          MPI_INT,
          MPI_COMM_WORLD,
          &request),
      rank_);
  waiter_.wait(&request, 1, "start-up all-gather", waiter_.next_sequence());
  std::vector<int> offsets(world_size_, 0);
  for (int r = 1; r < world_size_; ++r)
    offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::vector<char> all(
      static_cast<size_t>(offsets.back() + lengths.back()) + 1);
  MT_MPI_CHECK(
      MPI_Iallgatherv(
          text.data(),
          length,
          MPI_CHAR,
          all.data(),
          lengths.data(),
          offsets.data(),
          MPI_CHAR,
          MPI_COMM_WORLD,
          &request),
      rank_);
  waiter_.wait(&request, 1, "start-up all-gather", waiter_.next_sequence());
  std::vector<std::string> out;
  for (int r = 0; r < world_size_; ++r)
    out.emplace_back(&all[offsets[r]], static_cast<size_t>(lengths[r]));
  return out;
}

}  // namespace memtrain
