// Note [Host plan] (memory/host_plan.cpp): the holders of a rank's host
// memory, charged against its host budget.

#include <algorithm>

#include "memtrain/dist/communicator.h"
#include "memtrain/dist/environment.h"
#include "memtrain/memory/budget.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/memory/host_figures.h"
#include "memtrain/model/feature_cache.h"
#include "memtrain/util/error.h"
#include "memtrain/util/host_memory.h"
#include "train/state/run_state.h"
#include "train/tasks/task.h"

namespace memtrain {

namespace {

std::string mib(int64_t bytes) {
  return format_bytes(static_cast<double>(bytes));
}

// The training loader's buffers at its depth, for micro-batches of
// `micro`; `why` says how data.prefetch=auto chose the depth.
memory::HostHolder prefetch_holder(
    const RunState& run, int64_t micro, const std::string& why) {
  int64_t per = 0, count = 0;
  const int64_t bytes = run.loader->host_bytes_bound(micro, &per, &count);
  const int64_t depth = run.loader->depth();
  const bool is_auto = run.cfg.data.prefetch == kPrefetchAuto;
  return {
      "prefetch",
      bytes,
      detail::concat(
          count,
          " buffers of a micro-batch of ",
          micro,
          " (",
          mib(per),
          "): ",
          is_auto ? "data.prefetch=auto, " : "data.prefetch=",
          depth,
          " read ahead",
          why,
          depth > 0 ? ", one in use, a free list of prefetch + 2, one per "
                      "reader thread"
                    : ", one in use, two free"),
      is_auto ? "data.read_threads" : "data.prefetch, data.read_threads"};
}

// data.prefetch=auto: the deepest read-ahead up to `most` whose buffers
// at micro-batches of `micro` fit in what `plan`'s holders and the device
// domain's `device` bytes (the CPU device's; 0 on CUDA) leave of the
// budget; the loader is set to it and its holder in `plan` updated.
// Before planning up to 1 (taken ahead of the device domain's plan, Note
// [Host plan]), after it up to 2, from what the plan leaves, down to none.
void choose_prefetch_depth(
    RunState& run,
    memory::HostPlan& plan,
    int64_t micro,
    int64_t device,
    int64_t most) {
  if (!run.loader || run.cfg.data.prefetch != kPrefetchAuto)
    return;
  const int64_t now = run.loader->host_bytes_bound(micro);
  const int64_t left = plan.budget - plan.charged() - device + now;
  int64_t depth = most;
  while (depth > 0 && run.loader->host_bytes_bound_at(micro, depth) > left)
    --depth;
  std::string why;
  if (depth < most) {
    why = detail::concat(
        " (",
        depth + 1,
        " would need ",
        mib(run.loader->host_bytes_bound_at(micro, depth + 1)),
        "; the budget leaves ",
        mib(std::max<int64_t>(0, left)),
        " after the other holders",
        device > 0 ? detail::concat(" and the device domain's ", mib(device))
                   : std::string(),
        ")");
  }
  run.loader->set_depth(depth);
  for (memory::HostHolder& h : plan.holders) {
    if (h.name == "prefetch")
      h = prefetch_holder(run, micro, why);
  }
}

// Every holder but the CPU device and the offload pool, for micro-batches
// of `micro`.
std::vector<memory::HostHolder> other_holders(
    const RunState& run, int64_t micro) {
  std::vector<memory::HostHolder> out;
  memory::trim_host_heap();  // what glibc keeps free is nobody's holder
  const memory::HostFigures now = memory::read_host_figures();
  out.push_back(
      {"outside",
       std::max<int64_t>(0, now.rss - now.counted),
       detail::concat(
           "resident set ",
           mib(now.rss),
           " less the ",
           mib(now.counted),
           " memtrain counts, measured: the libraries (",
           mib(now.rss_file),
           " file-backed), their heaps, glibc's retention"),
       ""});
  if (run.loader)
    out.push_back(prefetch_holder(run, micro, ""));
  int64_t caches = run.train_data->info().chunk_cache_bytes;
  if (run.val_data)
    caches += run.val_data->info().chunk_cache_bytes;
  if (caches > 0) {
    out.push_back(
        {"HDF5 chunk caches",
         caches,
         "the open datasets' chunk caches (64 MiB each, or the dataset's "
         "size when smaller)",
         ""});
  }
  for (memory::HostHolder& h : run.task->host_holders(run))
    out.push_back(std::move(h));
  return out;
}

// Runs `make` (which builds a plan) and agrees on its refusal across the
// ranks: the refused rank throws its arithmetic (or the error `make`
// threw), the others a PeerError, and none waits in a collective the
// others skipped.
template <class Make>
void collectively(const RunState& run, Make make) {
  std::string why;
  try {
    why = memory::refusal(make(), run.comm.rank());
  } catch (const Error& e) {
    why = e.what();
  }
  if (!all_ranks_ok(run.comm, why.empty())) {
    if (why.empty())
      throw PeerError("the host plan was refused on another rank");
    throw Error(why);
  }
}

// memory.host_budget for this rank, chosen once (run.host_plan's budget
// and note).
int64_t host_budget_of(RunState& run) {
  if (run.host_plan.budget > 0)
    return run.host_plan.budget;
  const LocalRank local =
      local_rank_from_env([](const char* name) { return std::getenv(name); });
  run.host_plan.budget = memory::host_budget_bytes(
      run.cfg.memory.host_budget,
      job_memory(),
      local.local_size,
      run.placement.is_cuda(),
      memory::memlock_limit(),
      &run.host_plan.budget_note);
  return run.host_plan.budget;
}

}  // namespace

namespace {

// The least the CPU device's holder will charge when the device domain
// must hold `needed` (fit_cpu_device; 0 on CUDA, whose device memory is not
// host memory).
int64_t cpu_device_need(const RunState& run, int64_t needed) {
  if (run.placement.is_cuda())
    return 0;
  return run.budget.limited() ? needed
                              : std::max(needed, memory::stats().peak_reserved);
}

// The CPU device's holder (CPU runs only; its memory is host memory),
// fitted into what `plan`'s other holders leave: its cap comes down to
// that, when it is higher and `needed` (what the device domain must hold:
// the model before planning, the plan's peak after) fits under it. The
// cap is set; the holder is what the device domain may hold.
void fit_cpu_device(RunState& run, memory::HostPlan& plan, int64_t needed) {
  if (run.placement.is_cuda())
    return;
  if (!run.budget.limited()) {
    plan.holders.push_back(
        {"CPU device",
         cpu_device_need(run, needed),
         "memory.budget=none: the device domain's peak so far, not "
         "bounded",
         "memory.budget"});
    return;
  }
  const int64_t configured =
      budget_of(run.cfg.memory.budget, run.cfg.memory.headroom).bytes;
  const int64_t left = plan.budget - plan.charged();
  const int64_t cap = run.budget.allocator_cap();
  const int64_t device = std::max(std::min(cap, left), std::min(needed, cap));
  std::string how;
  if (device > left) {
    how = detail::concat(
        "the device domain must hold ",
        mib(needed),
        " (the model; after planning, the plan's peak and memory.headroom's "
        "share of memory.budget), more than the other holders leave");
  } else if (device < configured - run.budget.outside) {
    how = detail::concat(
        "the device domain's cap: memory.budget=",
        run.budget.spec,
        " (",
        mib(configured),
        ") lowered to what the other holders leave");
  } else {
    how = "the device domain's cap, memory.budget=" + run.budget.spec;
  }
  plan.holders.push_back({"CPU device", device, how, "memory.budget"});
  if (device < cap) {
    run.budget.bytes = device + run.budget.outside;
    memory::set_cap(run.budget.allocator_cap());
  }
}

// model.feature_cache=host: its holder, the blocks the task's slices need
// capped at what `plan`'s other holders leave (Note [The feature cache]);
// the cache takes them once every rank has agreed on its plan.
CacheBlocks fit_feature_cache(RunState& run, memory::HostPlan& plan) {
  if (!run.feature_cache)
    return {};
  const Task::CacheNeed need = run.task->feature_cache_need(run);
  const CacheBlocks want =
      FeatureCache::blocks_for(need.entries, need.entry_bytes);
  const int64_t left = std::max<int64_t>(0, plan.budget - plan.charged());
  const CacheBlocks got = FeatureCache::fit(want, left);
  memory::HostHolder h;
  h.name = "feature cache";
  h.bytes = got.bytes();
  h.how = detail::concat(
      need.how, ": ", want.blocks, " block(s) of ", mib(want.block));
  if (got.bytes() < want.bytes()) {
    h.how += detail::concat(
        "; capped at what the budget leaves after the other holders, ",
        mib(left),
        ": the slices met first are kept");
  }
  h.lower = "model.feature_cache=none";
  plan.holders.push_back(std::move(h));
  return got;
}

memory::HostPlan new_plan(RunState& run) {
  memory::HostPlan plan;
  plan.budget = host_budget_of(run);
  plan.budget_note = run.host_plan.budget_note;
  return plan;
}

}  // namespace

int64_t fit_host_before_planning(RunState& run) {
  int64_t left = 0;
  collectively(run, [&run, &left] {
    memory::HostPlan plan = new_plan(run);
    // The loader's buffers at the micro-batch a window takes when it is
    // fixed, else at 1: the planner's choice is charged after planning.
    const int64_t micro =
        run.cfg.data.batch_size == kAuto
            ? 1
            : std::min<int64_t>(run.cfg.data.batch_size, run.shape.rank_share);
    plan.holders = other_holders(run, micro);
    // data.prefetch=auto plans at 1 read ahead where it fits: the probes'
    // and the warm-up's reads run on a reader thread, as the windows' will
    // (reading on the training thread fragments its heap: a U-Net's peak
    // resident set 36 MiB higher, tests/e2e/memory.sh part 6 at
    // data.prefetch=0); plan_host chooses the depth.
    const int64_t reserved = memory::stats().reserved;
    choose_prefetch_depth(run, plan, micro, cpu_device_need(run, reserved), 1);
    fit_cpu_device(run, plan, reserved);
    left = plan.budget - plan.charged();
    run.host_charged_micro = micro;
    run.host_left = left;
    return plan;
  });
  return left;
}

int64_t host_deficit(const RunState& run, int64_t micro, int64_t offloaded) {
  if (run.placement.is_cuda() || !run.budget.limited() || !run.loader ||
      run.host_plan.budget <= 0)
    return 0;
  const int64_t grown = run.loader->host_bytes_bound(micro) -
                        run.loader->host_bytes_bound(run.host_charged_micro);
  return std::max<int64_t>(0, grown + offloaded - run.host_left);
}

bool plan_host(RunState& run, bool may_replan) {
  bool replan = false;
  CacheBlocks cache;
  collectively(run, [&run, &replan, &cache, may_replan] {
    memory::HostPlan plan = new_plan(run);
    plan.holders = other_holders(run, run.plan.micro_batch);
    if (run.plan.offload) {
      plan.holders.push_back(
          {"offload pool",
           run.plan.predicted_host_bytes,
           "the chosen tier's offloaded activations, as its probe measured "
           "them",
           "training.gradient_checkpointing (a tier without offload), "
           "memory.budget"});
    }
    // The plan's peak keeps the headroom the probes kept under their cap
    // (memory.headroom of the cap they ran under): a cap lowered to the
    // peak itself would leave no slack for the window's own bytes.
    const int64_t slack = static_cast<int64_t>(
        run.cfg.memory.headroom * static_cast<double>(run.budget.bytes));
    const int64_t needed =
        std::max(run.plan.predicted_peak + slack, memory::stats().reserved);
    // The probes load kernels and fill caches: the outside grows while
    // planning (37 MiB measured for a small U-Net). When the plan no longer
    // fits what the other holders leave the CPU device now, its cap comes
    // down to that and planning runs again under it, once.
    const int64_t left = plan.budget - plan.charged();
    if (may_replan && !run.placement.is_cuda() && run.budget.limited() &&
        needed > left && left > 0) {
      run.budget.bytes = left + run.budget.outside;
      memory::set_cap(run.budget.allocator_cap());
      replan = true;
      return memory::HostPlan{};  // no refusal
    }
    choose_prefetch_depth(
        run, plan, run.plan.micro_batch, cpu_device_need(run, needed), 2);
    fit_cpu_device(run, plan, needed);
    cache = fit_feature_cache(run, plan);
    run.host_plan = plan;
    return plan;
  });
  // Planning is collective: every rank plans again when one must. The
  // caps now leave out the loader's buffers at the plan's micro-batch and
  // its offload pool (a rank that fitted lowered its cap to what they
  // leave, or kept a lower one): the probes' host_deficit counts from
  // there, on every rank alike.
  if (all_ranks_ok(run.comm, !replan)) {
    // Not before: planning again probes with real samples, which must
    // neither fill nor hit the cache.
    if (run.feature_cache)
      run.feature_cache->set_capacity(cache);
    return true;
  }
  run.host_charged_micro = run.plan.micro_batch;
  run.host_left = run.plan.offload ? run.plan.predicted_host_bytes : 0;
  return false;
}

}  // namespace memtrain
