#include "multinorm/sweep.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include "multinorm/compare.h"
#include "multinorm/device.h"
#include "multinorm/error.h"
#include "multinorm/json_file.h"
#include "multinorm/run_config.h"

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

}  // namespace

SweepPlan load_sweep(const std::string& path) {
  const json doc = read_json_file(path);
  auto bad = [&](const std::string& key, const std::string& why) { throw ConfigError(path + ": " + key + ": " + why); };
  if (!doc.is_object()) throw ConfigError(path + ": expected a JSON object");
  static const std::vector<std::string> known = {"base", "output_dir", "parallel", "set", "grid", "runs"};
  for (auto it = doc.begin(); it != doc.end(); ++it)
    if (std::find(known.begin(), known.end(), it.key()) == known.end()) {
      std::string best;
      for (const auto& k : known)
        if (edit_distance(k, it.key()) <= 2) best = k;
      bad(it.key(), "unknown key" + (best.empty() ? "" : " (did you mean '" + best + "'?)") +
                        "; a sweep has base, output_dir, parallel, set, grid, runs");
    }
  SweepPlan plan;
  if (!doc.contains("base") || !doc["base"].is_string()) bad("base", "required: the base run config (a path)");
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  plan.base_config = doc["base"].get<std::string>();
  if (plan.base_config[0] != '/') plan.base_config = dir + "/" + plan.base_config;
  plan.output_dir = doc.value("output_dir", std::string("runs/sweep"));
  plan.parallel = doc.value("parallel", 1);
  if (plan.parallel < 1) bad("parallel", "must be >= 1");
  std::vector<std::string> common;
  if (doc.contains("set")) {
    if (!doc["set"].is_object()) bad("set", "expected an object of key: value overrides");
    for (auto it = doc["set"].begin(); it != doc["set"].end(); ++it) common.push_back(it.key() + "=" + value_text(it.value()));
  }
  if (doc.contains("grid")) {
    if (!doc["grid"].is_object()) bad("grid", "expected an object of key: [values]");
    std::vector<std::pair<std::string, json>> axes;
    for (auto it = doc["grid"].begin(); it != doc["grid"].end(); ++it) {
      if (!it.value().is_array() || it.value().empty()) bad("grid." + it.key(), "expected a non-empty list of values");
      axes.push_back({it.key(), it.value()});
    }
    std::vector<size_t> idx(axes.size(), 0);
    while (!axes.empty()) {
      SweepRun r;
      r.overrides = common;
      for (size_t a = 0; a < axes.size(); ++a) {
        const std::string v = value_text(axes[a].second[idx[a]]);
        r.overrides.push_back(axes[a].first + "=" + v);
        const auto dot = axes[a].first.rfind('.');
        r.name += (r.name.empty() ? "" : ",") + axes[a].first.substr(dot == std::string::npos ? 0 : dot + 1) + "=" + v;
      }
      plan.runs.push_back(r);
      size_t a = 0;
      while (a < axes.size() && ++idx[a] == axes[a].second.size()) idx[a++] = 0;
      if (a == axes.size()) break;
    }
  }
  if (doc.contains("runs")) {
    if (!doc["runs"].is_array()) bad("runs", "expected a list of {name, set}");
    for (size_t i = 0; i < doc["runs"].size(); ++i) {
      const json& e = doc["runs"][i];
      if (!e.is_object() || !e.contains("name") || !e["name"].is_string()) bad("runs[" + std::to_string(i) + "]", "needs a name");
      SweepRun r{e["name"].get<std::string>(), common};
      if (e.contains("set"))
        for (auto it = e["set"].begin(); it != e["set"].end(); ++it) r.overrides.push_back(it.key() + "=" + value_text(it.value()));
      plan.runs.push_back(r);
    }
  }
  if (plan.runs.empty()) bad("grid", "the sweep has no run (give grid and/or runs)");
  for (auto& r : plan.runs) {
    r.name = safe_name(r.name);
    r.overrides.push_back("output_dir=" + plan.output_dir + "/" + r.name);
    r.overrides.push_back("name=" + r.name);
    load_run_config(plan.base_config, r.overrides);  // validate every run before starting any
  }
  return plan;
}

namespace {

// Starts one run of the sweep as a child process (its output into its directory's train.log).
pid_t start_run(const SweepPlan& plan, const SweepRun& r, const std::string& exe, const std::string& dir) {
  std::vector<std::string> args = {exe, "train", "--config", plan.base_config, "--resume", "--quiet"};
  // Runs side by side share the cores (OpenMP threads that outnumber cores spin against each other).
  if (plan.parallel > 1)
    args.insert(args.end(), {"--set", "threads=" + std::to_string(std::max<long>(1, ::sysconf(_SC_NPROCESSORS_ONLN) / plan.parallel))});
  for (const auto& o : r.overrides) args.insert(args.end(), {"--set", o});
  const pid_t pid = ::fork();
  if (pid == 0) {
    const std::string log = dir + "/train.log";
    if (!std::freopen(log.c_str(), "a", stdout) || !std::freopen(log.c_str(), "a", stderr)) _exit(127);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(exe.c_str(), argv.data());
    _exit(127);
  }
  if (pid < 0) throw Error("sweep: fork failed");
  return pid;
}

// Every run not finished yet, at most plan.parallel at a time; the names of those that failed.
std::vector<std::string> run_all(const SweepPlan& plan, bool quiet) {
  const std::string exe = executable_dir() + "/multinorm";
  std::map<pid_t, std::string> running;
  std::vector<std::string> failed;
  auto reap = [&] {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid <= 0) return;
    const std::string name = running[pid];
    running.erase(pid);
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok) failed.push_back(name);
    if (!quiet) std::fprintf(stderr, "sweep: %s %s\n", name.c_str(), ok ? "finished" : "FAILED (see its train.log)");
  };
  for (const auto& r : plan.runs) {
    const std::string dir = plan.output_dir + "/" + r.name;
    if (finished(dir)) {
      if (!quiet) std::fprintf(stderr, "sweep: %s already finished, skipped\n", r.name.c_str());
      continue;
    }
    while (static_cast<int>(running.size()) >= plan.parallel) reap();
    ::mkdir(dir.c_str(), 0755);
    if (!quiet) std::fprintf(stderr, "sweep: starting %s\n", r.name.c_str());
    running[start_run(plan, r, exe, dir)] = r.name;
  }
  while (!running.empty()) reap();
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

std::string run_sweep(const SweepPlan& plan, bool quiet) {
  ::mkdir(plan.output_dir.c_str(), 0755);
  const std::vector<std::string> failed = run_all(plan, quiet);
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
