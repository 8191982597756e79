#include "multinorm/sweep.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>

#include "multinorm/comm.h"
#include "multinorm/compare.h"
#include "multinorm/device.h"
#include "multinorm/install_paths.h"
#include "multinorm/error.h"
#include "multinorm/json_file.h"
#include "multinorm/model_config.h"
#include "multinorm/run_config.h"
#include "multinorm/stop_signals.h"
#include "multinorm/trainer.h"

namespace multinorm {

namespace {

std::string value_text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

std::string safe_name(std::string s) {
  for (char& c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == '=')) c = '_';
  return s;
}

bool finished(const std::string& run_dir) {
  struct stat st {};
  return ::stat((run_dir + "/result.json").c_str(), &st) == 0;
}

// "" for a key a sweep file has, else why it is wrong (with the nearest known key).
std::string unknown_key(const std::string& key) {
  static const std::vector<std::string> known = {"base", "output_dir", "parallel", "set", "grid", "runs"};
  if (std::find(known.begin(), known.end(), key) != known.end()) return "";
  std::string best;
  for (const auto& k : known)
    if (edit_distance(k, key) <= 2) best = k;
  return "unknown key" + (best.empty() ? "" : " (did you mean '" + best + "'?)") + "; a sweep has base, output_dir, parallel, set, grid, runs";
}

// The grid's cartesian product, one run per combination on `proto`, named by it ("name=adam,lr=0.01").
using OverrideText = std::function<std::string(const std::string&, const json&)>;
std::vector<SweepRun> grid_runs(const std::vector<std::pair<std::string, json>>& axes, const SweepRun& proto, const OverrideText& text) {
  std::vector<SweepRun> runs;
  std::vector<size_t> idx(axes.size(), 0);
  while (!axes.empty()) {
    SweepRun r = proto;
    for (size_t a = 0; a < axes.size(); ++a) {
      r.overrides.push_back(text(axes[a].first, axes[a].second[idx[a]]));
      const auto dot = axes[a].first.rfind('.');
      r.name += (r.name.empty() ? "" : ",") + axes[a].first.substr(dot == std::string::npos ? 0 : dot + 1) + "=" +
                value_text(axes[a].second[idx[a]]);
    }
    runs.push_back(r);
    size_t a = 0;
    while (a < axes.size() && ++idx[a] == axes[a].second.size()) idx[a++] = 0;
    if (a == axes.size()) break;
  }
  return runs;
}

}  // namespace

SweepPlan load_sweep(const std::string& path) {
  const json doc = read_json_file(path);
  auto bad = [&](const std::string& key, const std::string& why) { throw ConfigError(path + ": " + key + ": " + why); };
  if (!doc.is_object()) throw ConfigError(path + ": expected a JSON object");
  for (auto it = doc.begin(); it != doc.end(); ++it)
    if (const std::string why = unknown_key(it.key()); !why.empty()) bad(it.key(), why);
  SweepPlan plan;
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  auto config_path = [&](const json& v, const std::string& key) {  // relative to the sweep file
    if (!v.is_string() || v.get<std::string>().empty()) bad(key, "expected a run config's path");
    const std::string p = v.get<std::string>();
    return p[0] == '/' ? p : dir + "/" + p;
  };
  if (doc.contains("base")) plan.base_config = config_path(doc["base"], "base");
  plan.output_dir = doc.value("output_dir", std::string("runs/sweep"));
  plan.parallel = doc.value("parallel", 1);
  if (plan.parallel < 1) bad("parallel", "must be >= 1");
  // key=value for a child's --set: a relative model.config path of the sweep file made relative to
  // the working directory (the child resolves --set values against it)
  auto override_text = [&](const std::string& key, const json& v) {
    std::string text = value_text(v);
    if (key == "model.config" && v.is_string() && !is_model_config_name(text) && !text.empty() && text[0] != '/') text = dir + "/" + text;
    return key + "=" + text;
  };
  std::vector<std::string> common;
  if (doc.contains("set")) {
    if (!doc["set"].is_object()) bad("set", "expected an object of key: value overrides");
    for (auto it = doc["set"].begin(); it != doc["set"].end(); ++it) common.push_back(override_text(it.key(), it.value()));
  }
  if (doc.contains("grid")) {
    if (!doc["grid"].is_object()) bad("grid", "expected an object of key: [values]");
    std::vector<std::pair<std::string, json>> axes;
    for (auto it = doc["grid"].begin(); it != doc["grid"].end(); ++it) {
      if (!it.value().is_array() || it.value().empty()) bad("grid." + it.key(), "expected a non-empty list of values");
      axes.push_back({it.key(), it.value()});
    }
    for (const SweepRun& r : grid_runs(axes, SweepRun{"", common, plan.base_config}, override_text)) plan.runs.push_back(r);
  }
  if (doc.contains("runs")) {
    if (!doc["runs"].is_array()) bad("runs", "expected a list of {name, config, set}");
    for (size_t i = 0; i < doc["runs"].size(); ++i) {
      const json& e = doc["runs"][i];
      const std::string key = "runs[" + std::to_string(i) + "]";
      if (!e.is_object() || !e.contains("name") || !e["name"].is_string()) bad(key, "needs a name");
      SweepRun r{e["name"].get<std::string>(), common, plan.base_config};
      if (e.contains("config")) r.config = config_path(e["config"], key + ".config");  // this run's own base
      if (e.contains("set"))
        for (auto it = e["set"].begin(); it != e["set"].end(); ++it) r.overrides.push_back(override_text(it.key(), it.value()));
      plan.runs.push_back(r);
    }
  }
  if (plan.runs.empty()) bad("grid", "the sweep has no run (give grid and/or runs)");
  for (auto& r : plan.runs) {
    if (r.config.empty()) bad("base", "required unless every run names its config: the run config the runs change");
    r.name = safe_name(r.name);
    r.overrides.push_back("output_dir=" + plan.output_dir + "/" + r.name);
    r.overrides.push_back("name=" + r.name);
    load_run_config(r.config, r.overrides);  // validate every run before starting any
  }
  return plan;
}

namespace {

// Starts one run of the sweep as a child process (its output into its directory's train.log), on
// the GPUs of `slot` when the sweep places runs (SweepPlacement).
pid_t start_run(const SweepRun& r, const SweepPlacement& where, const std::vector<int>& slot, int threads,
                const std::string& dir) {
  std::vector<std::string> args;
  if (slot.size() > 1) args = {where.mpirun, "-np", std::to_string(slot.size())};
  args.insert(args.end(), {executable_dir() + "/multinorm", "train", "--config", r.config, "--resume", "--quiet"});
  // Runs side by side share the cores (OpenMP threads that outnumber cores spin against each other).
  if (threads > 0) args.insert(args.end(), {"--set", "threads=" + std::to_string(threads)});
  for (const auto& o : r.overrides) args.insert(args.end(), {"--set", o});
  std::string visible;
  for (int g : slot) visible += (visible.empty() ? "" : ",") + std::to_string(g);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const std::string log = dir + "/train.log";
    if (!std::freopen(log.c_str(), "a", stdout) || !std::freopen(log.c_str(), "a", stderr)) _exit(127);
    if (!slot.empty()) ::setenv("CUDA_VISIBLE_DEVICES", visible.c_str(), 1);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "sweep: cannot run %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  if (pid < 0) throw Error("sweep: fork failed");
  return pid;
}

// The slots runs take, one run each at a time: the placement's GPUs in groups of gpus_per_run, or,
// with no placement, `parallel` slots without GPUs.
std::vector<std::vector<int>> slots_of(const SweepPlan& plan, const SweepPlacement& where) {
  if (where.gpus.empty()) return std::vector<std::vector<int>>(static_cast<size_t>(plan.parallel));
  const size_t n = static_cast<size_t>(where.gpus_per_run);
  if (n < 1 || where.gpus.size() % n != 0)
    throw ConfigError("sweep: --gpus-per-run " + std::to_string(where.gpus_per_run) + " does not divide the " +
                      std::to_string(where.gpus.size()) + " GPUs of --gpus");
  std::vector<std::vector<int>> slots;
  for (size_t i = 0; i < where.gpus.size(); i += n) slots.emplace_back(where.gpus.begin() + i, where.gpus.begin() + i + n);
  for (const SweepRun& r : plan.runs) {  // every run's global batch must split over a slot's ranks
    try {
      check_batch_over_ranks(load_run_config(r.config, r.overrides), static_cast<int64_t>(n));
    } catch (const ConfigError& e) {
      throw ConfigError("sweep: run " + r.name + " with --gpus-per-run " + std::to_string(n) + ": " + e.what());
    }
  }
  return slots;
}

// Every run not finished yet, one per slot at a time; the names of those that failed. A stop signal
// (SIGTERM, SIGINT, SIGUSR1) to the sweep is passed to every running run as SIGUSR1 (mpirun forwards
// that one to its ranks), no run starts after it, and once the runs have stopped with their
// checkpoints (status 75) the sweep ends as a stopped run does: StoppedBySignal, exit 75.
std::vector<std::string> run_all(const SweepPlan& plan, const SweepPlacement& where, bool quiet) {
  StopSignals stop;
  Comm::set_activity("the sweep");
  const std::vector<std::vector<int>> slots = slots_of(plan, where);
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  const int threads = slots.size() > 1 ? static_cast<int>(std::max<long>(1, cores / static_cast<long>(slots.size()))) : 0;
  std::vector<size_t> free_slots;
  for (size_t i = slots.size(); i-- > 0;) free_slots.push_back(i);
  std::map<pid_t, std::pair<std::string, size_t>> running;  // pid -> run, slot
  std::vector<std::string> failed, stopped;
  bool passed_on = false;
  // One run's end (polled, so that a stop signal is passed on at once).
  auto reap = [&] {
    int status = 0;
    pid_t pid = 0;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) == 0) {
      if (StopSignals::received() && !passed_on) {
        for (const auto& [child, run] : running) ::kill(child, SIGUSR1);
        passed_on = true;
      }
      ::usleep(50000);
    }
    if (pid < 0) return;
    const auto [name, slot] = running[pid];
    running.erase(pid);
    free_slots.push_back(slot);
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    const bool paused = WIFEXITED(status) && WEXITSTATUS(status) == kStoppedBySignalStatus;
    if (paused) stopped.push_back(name);
    else if (!ok) failed.push_back(name);
    if (!quiet)
      std::fprintf(stderr, "sweep: %s %s\n", name.c_str(),
                   ok ? "finished" : paused ? "stopped with its checkpoint" : "FAILED (see its train.log)");
  };
  for (const auto& r : plan.runs) {
    if (StopSignals::received()) break;  // no run starts after a stop
    const std::string dir = plan.output_dir + "/" + r.name;
    if (finished(dir)) {
      if (!quiet) std::fprintf(stderr, "sweep: %s already finished, skipped\n", r.name.c_str());
      continue;
    }
    while (free_slots.empty()) reap();
    if (StopSignals::received()) break;
    const size_t slot = free_slots.back();
    free_slots.pop_back();
    ::mkdir(dir.c_str(), 0755);
    std::string on;
    for (int g : slots[slot]) on += (on.empty() ? " on GPU " : ",") + std::to_string(g);
    if (slots[slot].size() > 1) on += " (" + where.mpirun + " -np " + std::to_string(slots[slot].size()) + ")";
    if (!quiet) std::fprintf(stderr, "sweep: starting %s%s\n", r.name.c_str(), on.c_str());
    running[start_run(r, where, slots[slot], threads, dir)] = {r.name, slot};
  }
  while (!running.empty()) reap();
  if (StopSignals::received())
    throw StoppedBySignal("sweep stopped by " + std::string(StopSignals::name(StopSignals::received())) + ": " +
                          std::to_string(stopped.size()) + " run(s) stopped with their checkpoints" +
                          (failed.empty() ? "" : ", " + std::to_string(failed.size()) + " failed") +
                          "; run the sweep again to go on (each run resumes)");
  return failed;
}

// A finished run's line of summary.csv and row of summary.md.
std::pair<std::string, std::string> summary_row(const std::string& name, const std::string& dir) {
  const json res = read_json_file(dir + "/result.json");
  double best = INFINITY;
  std::ifstream in(dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const json m = json::parse(line, nullptr, false);
    if (!m.is_discarded() && m.value("type", "") == "eval") best = std::min(best, m["val_ppl"].get<double>());
  }
  const double final_ppl = res.value("final_val_ppl", NAN), tps = res.value("tokens_per_s", 0.0), wall = res.value("wall_s", 0.0);
  const double state_mib = res.value("optimizer_state_bytes", 0) / 1048576.0;
  const long long updates = res.value("updates", 0), tokens = res.value("tokens", 0);
  char csv[512], md[512];
  std::snprintf(csv, sizeof(csv), "%s,%.4f,%.4f,%lld,%lld,%.0f,%.1f,%.2f\n", name.c_str(), final_ppl, best, updates, tokens, tps, wall, state_mib);
  std::snprintf(md, sizeof(md), "| %s | %.2f | %.2f | %lld | %lld | %.0f | %.0f s | %.1f MiB |\n", name.c_str(), final_ppl, best, updates, tokens, tps,
                wall, state_mib);
  return {csv, md};
}

// The paper's comparison (compare.h), one per group of comparable runs: a sweep over several
// models gets one per model. Markdown for summary.md.
std::string comparisons(const SweepPlan& plan, const std::vector<std::string>& dirs, bool quiet) {
  std::string md;
  std::vector<RunCurve> curves;
  for (const auto& d : dirs) {
    if (!finished(d)) continue;
    try {
      curves.push_back(load_run_curve(d, CompareMetric::ValLoss));
    } catch (const ConfigError& e) {
      md += "\n" + std::string(e.what()) + ": left out of the comparison\n";
    }
  }
  const auto groups = group_comparable(std::move(curves));
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string stem = groups.size() == 1 ? "comparison" : "comparison-" + std::to_string(g + 1);
    const Comparison c = compare_runs(groups[g], "", CompareMetric::ValLoss, false);
    const std::string png = write_comparison(c, plan.output_dir, stem, quiet);
    md += "\n## Optimizer comparison" + (groups.size() > 1 ? " " + std::to_string(g + 1) + " of " + std::to_string(groups.size()) : "") +
          " (`multinorm compare`)\n\n" + comparison_markdown(c) + "\nFiles: " + stem + ".md, " + stem + ".csv" +
          (png.empty() ? "" : ", " + stem + ".png") + "\n";
  }
  return md;
}

}  // namespace

std::vector<int> parse_gpu_list(const std::string& text) {
  const std::string usage = "--gpus " + text + ": expected GPU ids such as 0-7 or 0,1,4-5";
  std::vector<int> ids;
  size_t i = 0;
  auto number = [&] {
    size_t end = i;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
    if (end == i || end - i > 6) throw ConfigError(usage);
    const int v = std::stoi(text.substr(i, end - i));
    i = end;
    return v;
  };
  while (i < text.size()) {
    const int first = number();
    const int last = i < text.size() && text[i] == '-' ? (++i, number()) : first;
    if (last < first) throw ConfigError(usage + " (" + std::to_string(first) + "-" + std::to_string(last) + " is empty)");
    for (int g = first; g <= last; ++g) {
      if (std::find(ids.begin(), ids.end(), g) != ids.end()) throw ConfigError("--gpus " + text + ": GPU " + std::to_string(g) + " twice");
      ids.push_back(g);
    }
    if (i < text.size() && text[i++] != ',') throw ConfigError(usage);
  }
  if (ids.empty()) throw ConfigError(usage);
  return ids;
}

std::string run_sweep(const SweepPlan& plan, const SweepPlacement& where, bool quiet) {
  make_directories(plan.output_dir);
  const std::vector<std::string> failed = run_all(plan, where, quiet);

  std::string csv = "run,final_val_ppl,best_val_ppl,updates,tokens,tokens_per_s,wall_s,optimizer_state_mib\n";
  std::string md = "| run | final val. ppl | best val. ppl | updates | tokens | tokens/s | wall time | optimizer state |\n"
                   "|---|---|---|---|---|---|---|---|\n";
  std::vector<std::string> dirs;
  for (const auto& r : plan.runs) {
    const std::string dir = plan.output_dir + "/" + r.name;
    dirs.push_back(dir);
    if (!finished(dir)) {
      csv += r.name + ",,,,,,,\n";
      md += "| " + r.name + " | failed | | | | | | |\n";
      continue;
    }
    const auto [c, m] = summary_row(r.name, dir);
    csv += c, md += m;
  }
  md += comparisons(plan, dirs, quiet);
  write_text_file_atomic(plan.output_dir + "/summary.csv", csv);
  write_text_file_atomic(plan.output_dir + "/summary.md", md);
  std::string cmd = "/usr/bin/python3 " + std::string(MULTINORM_SOURCE_DIR) + "/scripts/plot_runs.py";
  for (const auto& d : dirs)
    if (finished(d)) cmd += " '" + d + "'";
  cmd += " --out '" + plan.output_dir + "/curves.png' > /dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0 && !quiet) std::fprintf(stderr, "sweep: plotting skipped (python3-matplotlib missing?)\n");
  if (!failed.empty()) throw Error("sweep: " + std::to_string(failed.size()) + " run(s) failed: " + failed.front() + " ...");
  return plan.output_dir + "/summary.md";
}

}  // namespace multinorm
