#include "memtrain/train/logs/run_plot.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "memtrain/train/logs/metrics.h"
#include "memtrain/util/atomic_file.h"
#include "memtrain/util/error.h"

extern char** environ;

namespace memtrain {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string base_name(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/')
    dir.pop_back();
  const auto at = dir.rfind('/');
  return at == std::string::npos ? dir : dir.substr(at + 1);
}

// gnuplot single-quoted string: '' stands for '. A newline would end the
// command (and the rest of the string run as the next one).
std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    MT_CHECK(
        static_cast<unsigned char>(c) >= 0x20,
        "cannot plot '",
        s,
        "': the path holds a control character (a newline?); rename it");
    q += c == '\'' ? std::string("''") : std::string(1, c);
  }
  return q + "'";
}

// j[key] as a number; NaN when absent or null (a skipped window's loss):
// gnuplot leaves a gap there.
double number_or_nan(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

// The metric a validation record is drawn by: the first of the task's
// val_metrics that has a direction (Note [Tasks]), else val_loss. Records
// written before val_metrics existed: val_dice or val_accuracy.
std::string first_ranked_metric(const nlohmann::json& j, std::string* better) {
  const auto list = j.find("val_metrics");
  if (list != j.end() && list->is_array()) {
    for (const auto& m : *list) {
      const std::string b = m.value("better", "none");
      if (b != "none" && m.contains("key") && m["key"].is_string()) {
        *better = b;
        return m["key"].get<std::string>();
      }
    }
  } else {
    *better = "higher";
    for (const char* old : {"val_dice", "val_accuracy"}) {
      if (j.contains(old))
        return old;
    }
  }
  *better = "lower";
  return "val_loss";
}

void data_block(
    std::ostringstream& out,
    const std::string& name,
    const std::vector<std::array<double, 2>>& points) {
  out << "$" << name << " << EOD\n";
  for (const auto& p : points) {
    if (std::isfinite(p[1])) {
      out << p[0] << " " << p[1] << "\n";
    } else {
      out << "\n";  // a blank line: the curve breaks here
    }
  }
  out << "EOD\n";
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

RunCurves load_run_curves(const std::string& dir) {
  RunCurves c;
  c.label = base_name(dir);
  const std::string path = dir + "/metrics.jsonl";
  const bool found =
      for_each_record(path, [&c](const nlohmann::json& j, const std::string&) {
        const std::string type = j.value("type", "");
        if (type == "window") {
          const double step = j.value("step", 0.0);
          c.loss.push_back({step, number_or_nan(j, "loss")});
          c.mem_peak.push_back({step, number_or_nan(j, "mem_peak") / kMiB});
        } else if (type == "validation") {
          c.val_metric = first_ranked_metric(j, &c.val_better);
          c.val.push_back(
              {j.value("epoch", 0.0) + 1,
               number_or_nan(j, c.val_metric.c_str())});
        }
      });
  MT_CHECK(
      found,
      "'",
      dir,
      "' has no metrics.jsonl: give the output.dir of a memtrain train run");
  MT_CHECK(
      !c.loss.empty(),
      "'",
      path,
      "' holds no window record yet: nothing to plot");
  std::ifstream plan_in(dir + "/memory_plan.json");
  if (plan_in.good()) {
    try {
      const auto plan = nlohmann::json::parse(plan_in);
      if (plan.value("usable_bytes", 0.0) > 0)
        c.budget_mib = plan.value("budget_bytes", 0.0) / kMiB;
    } catch (const nlohmann::json::exception&) {
    }
  }
  return c;
}

std::string plot_script(
    const std::vector<RunCurves>& runs, const std::string& png) {
  std::ostringstream out;
  out.precision(9);
  out << "set terminal pngcairo size " << kPlotWidth << "," << kPlotHeight
      << " noenhanced font ',10'\nset output " << quoted(png) << "\n";
  for (size_t r = 0; r < runs.size(); ++r) {
    data_block(out, "loss" + std::to_string(r), runs[r].loss);
    data_block(out, "mem" + std::to_string(r), runs[r].mem_peak);
    data_block(out, "val" + std::to_string(r), runs[r].val);
  }
  auto plot = [&](const std::string& block, const char* style) {
    out << "plot ";
    for (size_t r = 0; r < runs.size(); ++r) {
      out << (r ? ", " : "") << "$" << block << r << " using 1:2 with " << style
          << " lt " << r + 1 << " title " << quoted(runs[r].label);
    }
  };
  std::string metric;
  for (const auto& r : runs) {
    if (!r.val_metric.empty())
      metric = r.val_metric + " (" + r.val_better + " is better)";
  }
  out << "set multiplot layout 3,1\nset grid\nset key outside right\n"
         "set title 'loss per window'\nset xlabel 'step (window)'\n"
         "set ylabel 'loss'\n";
  plot("loss", "lines");
  out << "\nset title 'validation'\nset xlabel 'epoch'\nset ylabel "
      << quoted(metric.empty() ? "no validation" : metric) << "\n";
  bool any_val = false;
  double last_epoch = 0;
  for (const auto& r : runs) {
    any_val = any_val || !r.val.empty();
    last_epoch =
        r.val.empty() ? last_epoch : std::max(last_epoch, r.val.back()[0]);
  }
  if (last_epoch <= 20)
    out << "set xtics 1\n";  // whole epochs
  if (any_val) {
    plot("val", "linespoints pt 7");
    out << "\n";
  } else {
    out << "set label 1 'no validation record' at graph 0.5,0.5 center\n"
           "plot [0:1] [0:1] NaN notitle\nunset label 1\n";
  }
  out << "set xtics autofreq\n"
         "set title 'memory peak per window (dashed: budget)'\n"
         "set xlabel 'step (window)'\nset ylabel 'MiB'\n";
  plot("mem", "lines");
  for (size_t r = 0; r < runs.size(); ++r) {
    if (runs[r].budget_mib > 0) {
      out << ", " << runs[r].budget_mib << " with lines dt 2 lt " << r + 1
          << " title " << quoted(runs[r].label + " budget");
    }
  }
  out << "\nunset multiplot\n";
  return out.str();
}

std::string draw_runs(
    const std::vector<RunCurves>& runs, const std::string& png) {
  const std::string tmp = png + ".tmp-" + std::to_string(::getpid());
  const std::string script_path = tmp + ".gp";
  const std::string err_path = tmp + ".err";
  write_file_atomically(script_path, plot_script(runs, tmp));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(
      &actions, 1, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  // $MEMTRAIN_GNUPLOT, else gnuplot on PATH (mpirun started by its full
  // path puts its own folder first on the ranks' PATH).
  const char* env = std::getenv("MEMTRAIN_GNUPLOT");
  std::string gp = env && *env ? env : "gnuplot";
  char* argv[] = {gp.data(), const_cast<char*>(script_path.c_str()), nullptr};
  pid_t pid = 0;
  const int rc =
      posix_spawnp(&pid, gp.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  std::string why;
  if (rc != 0) {
    why = rc == ENOENT
              ? "gnuplot not found ('" + gp + "'; apt-get install gnuplot-nox)"
              : "cannot start '" + gp + "': " + std::strerror(rc);
  } else {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    std::string err = read_all(err_path);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      // gnuplot's message is its last line ("file" line N: what).
      while (!err.empty() && (err.back() == '\n' || err.back() == ' '))
        err.pop_back();
      err = err.substr(
          err.rfind('\n') == std::string::npos ? 0 : err.rfind('\n') + 1);
      why = "gnuplot failed (status " +
            std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")" +
            (err.empty() ? "" : ": " + err);
    } else if (::rename(tmp.c_str(), png.c_str()) != 0) {
      why = "cannot rename '" + tmp + "' to '" + png +
            "': " + std::strerror(errno);
    }
  }
  for (const auto& p : {tmp, script_path, err_path})
    std::remove(p.c_str());
  return why;
}

}  // namespace memtrain
