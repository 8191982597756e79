#include "multinorm/compare.h"

#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>

#include "multinorm/checkpoint.h"
#include "multinorm/error.h"
#include "multinorm/json_file.h"
#include "multinorm/paper_figures.h"
#include "multinorm/trainer.h"

namespace multinorm {

namespace {

std::string base_name(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const auto slash = dir.find_last_of('/');
  return slash == std::string::npos ? dir : dir.substr(slash + 1);
}

std::string real_path(const std::string& p) {
  char* r = ::realpath(p.c_str(), nullptr);
  if (!r) return p;
  std::string s(r);
  std::free(r);
  return s;
}

bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

// The settings that must agree for losses to be comparable: what is learned from (model, data,
// tokens per update) and how the loss is measured (validation budget).
json comparability_of(const json& cfg) {
  auto at = [&](const char* a, const char* b) -> json {
    return cfg.contains(a) && cfg[a].contains(b) ? cfg[a][b] : json();
  };
  return {{"model", {{"config", at("model", "config")}}},
          {"data", {{"train", at("data", "train")}, {"validation", at("data", "validation")},
                    {"tokenizer", at("data", "tokenizer")}, {"layout", at("data", "layout")}}},
          {"batch", {{"global_batch", at("batch", "global_batch")}, {"seq_len", at("batch", "seq_len")}}},
          {"eval", {{"tokens", at("eval", "tokens")}}}};
}

// "batch.seq_len 512 (reference 256); model.config.hidden_size 384 (reference 256)"
std::string differences(const std::string& run, const std::string& ref) {
  const json a = json::parse(run).flatten(), b = json::parse(ref).flatten();
  std::vector<std::string> out;
  auto key_of = [](std::string k) {
    std::replace(k.begin(), k.end(), '/', '.');
    return k.substr(1);
  };
  for (auto it = a.begin(); it != a.end(); ++it)
    if (!b.contains(it.key()) || b[it.key()] != it.value())
      out.push_back(key_of(it.key()) + " " + it.value().dump() + " (reference " +
                    (b.contains(it.key()) ? b[it.key()].dump() : "unset") + ")");
  for (auto it = b.begin(); it != b.end(); ++it)
    if (!a.contains(it.key())) out.push_back(key_of(it.key()) + " unset (reference " + it.value().dump() + ")");
  std::string s;
  for (size_t i = 0; i < out.size() && i < 3; ++i) s += (i ? "; " : "") + out[i];
  if (out.size() > 3) s += "; and " + std::to_string(out.size() - 3) + " more";
  return s;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof(b), f, v);
  return b;
}

std::string human_tokens(double t) {
  if (t >= 1e9) return fmt("%.2fB", t / 1e9);
  if (t >= 1e6) return fmt("%.2fM", t / 1e6);
  if (t >= 1e3) return fmt("%.1fk", t / 1e3);
  return fmt("%.0f", t);
}

std::string human_seconds(double s) {
  if (s >= 3600) return fmt("%.2f h", s / 3600);
  if (s >= 60) return fmt("%.1f min", s / 60);
  return fmt("%.1f s", s);
}

std::string mib(int64_t bytes) { return bytes < 0 ? "?" : fmt("%.1f MiB", bytes / 1048576.0); }

const char* metric_name(CompareMetric m) { return m == CompareMetric::ValLoss ? "val_loss" : "train_loss"; }

// The cells of one row, shared by the Markdown and terminal tables.
std::vector<std::string> cells(const Comparison& c, const CompareRow& r, bool reference) {
  const RunCurve& run = c.runs[r.run];
  const bool ok = r.crossing.reached;
  const std::string le = r.crossing.at_first_point ? "≤ " : "";
  auto speed = [&](double v) { return ok ? fmt("%.2fx", v) : std::string("—"); };
  return {run.name + (reference ? " (reference)" : ""),
          run.optimizer,
          fmt("%.4f", r.final_loss),
          fmt("%.2f", std::exp(r.final_loss)),
          run.paper_ppl > 0 ? fmt("%.2f", run.paper_ppl) + " (" + run.paper_row + ")" : "—",
          ok ? le + fmt("%.1f", r.crossing.steps) : "not reached",
          ok ? le + human_tokens(r.crossing.tokens) : "—",
          ok ? le + human_seconds(r.crossing.seconds) : "—",
          speed(r.speedup_steps) + " / " + speed(r.speedup_tokens) + " / " + speed(r.speedup_time),
          fmt("%.0f", r.raw_tokens_per_s),
          ok ? fmt("%.0f", r.effective_tokens_per_s) : "—",
          mib(run.state_bytes),
          mib(run.peak_rss_bytes),
          r.flags};
}

const std::vector<std::string>& headers() {
  static const std::vector<std::string> h = {"run", "optimizer", "final loss", "final ppl", "paper ppl", "updates to target",
                                              "tokens to target", "time to target", "speed-up (updates / tokens / time)",
                                              "raw tok/s", "effective tok/s", "optimizer state", "peak RSS", "notes"};
  return h;
}

std::string preamble(const Comparison& c) {
  const RunCurve& ref = c.runs[c.reference];
  std::string metric = c.metric == CompareMetric::ValLoss ? "validation loss"
                                                          : "training loss (trailing mean; see --window)";
  return "Target: the reference's final " + metric + ", " + fmt("%.4f", c.target) + " (perplexity " +
         fmt("%.2f", std::exp(c.target)) + "); reference " + ref.name + " (" + c.reference_reason + ").\n" +
         "Figures to target interpolate linearly between evaluations; time is training time (the updates' "
         "step_s, no evaluation or checkpoints); effective tok/s = raw tok/s x (reference tokens to target / "
         "the run's).\n";
}

}  // namespace

Crossing first_crossing(const RunCurve& curve, double target) {
  Crossing c;
  for (size_t i = 0; i < curve.loss.size(); ++i) {
    if (!(curve.loss[i] <= target)) continue;
    c.reached = true;
    if (i == 0) {
      c.at_first_point = true;
      c.steps = static_cast<double>(curve.steps[0]), c.tokens = curve.tokens[0], c.seconds = curve.seconds[0];
      return c;
    }
    // Between point i-1 (above the target) and i (at or below it).
    const double f = (curve.loss[i - 1] - target) / (curve.loss[i - 1] - curve.loss[i]);
    auto lerp = [f](double a, double b) { return a + f * (b - a); };
    c.steps = lerp(static_cast<double>(curve.steps[i - 1]), static_cast<double>(curve.steps[i]));
    c.tokens = lerp(curve.tokens[i - 1], curve.tokens[i]);
    c.seconds = lerp(curve.seconds[i - 1], curve.seconds[i]);
    return c;
  }
  return c;
}

namespace {

// A run's metrics.jsonl: its updates' tokens, times and losses, and its evaluations, by step. A
// resumed run appends the updates after its checkpoint again: the last record of a step wins.
struct TrainRecord {
  double tokens = 0, step_s = 0, loss = 0;
};
void read_metrics(const std::string& path, std::map<int64_t, TrainRecord>& train, std::map<int64_t, double>& eval, int64_t& peak_rss) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot open (has the run started?)");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  for (size_t i = 0; i < lines.size(); ++i) {
    const json m = json::parse(lines[i], nullptr, false);
    if (m.is_discarded() || !m.is_object()) {
      if (i + 1 == lines.size()) break;  // a line cut short by a crash: only the last one may be
      throw ConfigError(path + ":" + std::to_string(i + 1) + ": not a JSON record");
    }
    const std::string type = m.value("type", "");
    try {
      if (type == "train") {
        train[m.at("step").get<int64_t>()] = {m.at("tokens").get<double>(), m.at("step_s").get<double>(), m.at("loss").get<double>()};
        peak_rss = std::max<int64_t>(peak_rss, m.value("rss_bytes", int64_t{0}));
      } else if (type == "eval") {
        eval[m.at("step").get<int64_t>()] = m.at("val_loss").get<double>();
      }
    } catch (const json::exception& e) {
      throw ConfigError(path + ":" + std::to_string(i + 1) + ": " + type + " record: " + e.what());
    }
  }
  if (train.empty()) throw ConfigError(path + ": no training update recorded");
}

// The whole optimizer state's size: result.json's, or the newest checkpoint's (-1: unknown).
int64_t recorded_state_bytes(const std::string& dir) {
  if (exists(dir + "/result.json")) return read_json_file(dir + "/result.json").value("optimizer_state_bytes", int64_t{-1});
  const std::string newest = latest_checkpoint(dir);
  if (newest.empty() || !exists(newest + "/trainer_state.json")) return -1;
  const auto verify = verify_reads_of(newest);  // a damaged checkpoint is an error, not a wrong figure
  return read_json_file(newest + "/trainer_state.json").value("optimizer_state_bytes", int64_t{-1});
}

}  // namespace

RunCurve load_run_curve(const std::string& dir, CompareMetric metric, int window) {
  RunCurve r;
  r.dir = dir;
  r.name = base_name(dir);
  if (exists(dir + "/trainer_state.json"))
    throw ConfigError(dir + ": a checkpoint directory; compare takes run directories (the one holding checkpoints/ and metrics.jsonl)");
  if (!exists(dir + "/config.json"))
    throw ConfigError(dir + ": no config.json: not a multinorm run directory");
  const json cfg = read_json_file(dir + "/config.json");
  r.optimizer = cfg.contains("optimizer") ? cfg["optimizer"].value("name", "?") : "?";
  r.comparability = comparability_of(cfg).dump();
  if (const auto figure = paper_figure(cfg)) r.paper_ppl = figure->perplexity, r.paper_row = figure->table + ", " + figure->row;
  std::map<int64_t, TrainRecord> train;
  std::map<int64_t, double> eval;
  const std::string path = dir + "/metrics.jsonl";
  read_metrics(path, train, eval, r.peak_rss_bytes);

  std::map<int64_t, std::pair<double, double>> at;  // step -> (tokens, training seconds so far)
  double seconds = 0;
  std::vector<double> recent;
  double recent_sum = 0;
  for (const auto& [step, t] : train) {
    seconds += t.step_s;
    at[step] = {t.tokens, seconds};
    if (metric == CompareMetric::TrainLoss) {
      recent.push_back(t.loss);
      recent_sum += t.loss;
      if (static_cast<int>(recent.size()) > window) recent_sum -= recent[recent.size() - window - 1];
      const size_t n = std::min<size_t>(recent.size(), window);
      if (static_cast<int>(n) == window || step == train.rbegin()->first) {
        r.steps.push_back(step), r.tokens.push_back(t.tokens), r.seconds.push_back(seconds);
        r.loss.push_back(recent_sum / static_cast<double>(n));
      }
    }
  }
  r.updates = train.rbegin()->first;
  r.total_tokens = train.rbegin()->second.tokens;
  r.total_seconds = seconds;
  r.missing_updates = r.updates - static_cast<int64_t>(train.size());
  if (metric == CompareMetric::ValLoss)
    for (const auto& [step, loss] : eval) {
      const auto it = at.find(step);
      if (it == at.end()) continue;  // an evaluation whose update left no record
      r.steps.push_back(step), r.tokens.push_back(it->second.first), r.seconds.push_back(it->second.second);
      r.loss.push_back(loss);
    }
  if (r.loss.empty())
    throw ConfigError(path + ": no " + std::string(metric_name(metric)) + " point" +
                      (metric == CompareMetric::ValLoss ? " (no evaluation yet: eval.every, or a finished run)" : ""));
  r.state_bytes = recorded_state_bytes(dir);
  return r;
}

Comparison compare_runs(std::vector<RunCurve> runs, const std::string& reference, CompareMetric metric,
                        bool allow_mismatch) {
  if (runs.empty()) throw ConfigError("compare: no run given");
  Comparison c;
  c.metric = metric;
  c.runs = std::move(runs);
  if (!reference.empty()) {
    const std::string want = real_path(reference);
    size_t i = 0;
    while (i < c.runs.size() && real_path(c.runs[i].dir) != want) ++i;
    if (i == c.runs.size()) throw ConfigError("compare: --reference " + reference + " is not among the runs");
    c.reference = i;
    c.reference_reason = "given";
  } else {
    auto best = [&](bool adam_only) {
      size_t pick = SIZE_MAX;
      for (size_t i = 0; i < c.runs.size(); ++i) {
        if (adam_only && c.runs[i].optimizer.rfind("adam", 0) != 0) continue;
        if (pick == SIZE_MAX || c.runs[i].loss.back() < c.runs[pick].loss.back()) pick = i;
      }
      return pick;
    };
    c.reference = best(true);
    c.reference_reason = "the Adam run with the lowest final loss";
    if (c.reference == SIZE_MAX) {
      c.reference = best(false);
      c.reference_reason = "no Adam run among them: the run with the lowest final loss";
    }
  }
  const RunCurve& ref = c.runs[c.reference];
  c.target = ref.loss.back();
  const Crossing ref_cross = first_crossing(ref, c.target);  // reached: its own last point is the target

  std::string refused;
  for (const RunCurve& run : c.runs) {
    CompareRow row;
    row.run = static_cast<size_t>(&run - c.runs.data());
    row.final_loss = run.loss.back();
    row.crossing = first_crossing(run, c.target);
    row.raw_tokens_per_s = run.total_seconds > 0 ? run.total_tokens / run.total_seconds : 0;
    if (row.crossing.reached) {
      auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
      row.speedup_steps = ratio(ref_cross.steps, row.crossing.steps);
      row.speedup_tokens = ratio(ref_cross.tokens, row.crossing.tokens);
      row.speedup_time = ratio(ref_cross.seconds, row.crossing.seconds);
      row.effective_tokens_per_s = row.raw_tokens_per_s * row.speedup_tokens;
    }
    std::vector<std::string> notes;
    if (run.comparability != ref.comparability) {
      const std::string diff = differences(run.comparability, ref.comparability);
      if (!allow_mismatch) refused += "\n  " + run.dir + ": " + diff;
      notes.push_back("NOT COMPARABLE: " + diff);
    }
    if (row.crossing.at_first_point) notes.push_back("below the target at its first evaluation: upper bounds");
    if (run.missing_updates > 0)
      notes.push_back(std::to_string(run.missing_updates) + " updates without a metrics record: time undercounted");
    for (size_t i = 0; i < notes.size(); ++i) row.flags += (i ? "; " : "") + notes[i];
    c.rows.push_back(row);
  }
  if (!refused.empty())
    throw ConfigError("compare: runs that differ from the reference " + ref.dir +
                      " in model, data, batch or evaluation are not comparable (--allow-mismatch keeps them, "
                      "flagged):" + refused);
  return c;
}

std::string comparison_markdown(const Comparison& c) {
  std::string md = preamble(c) + "\n|";
  for (const auto& h : headers()) md += " " + h + " |";
  md += "\n|";
  for (size_t i = 0; i < headers().size(); ++i) md += "---|";
  md += "\n";
  for (size_t i = 0; i < c.rows.size(); ++i) {
    md += "|";
    for (const auto& cell : cells(c, c.rows[i], i == c.reference)) md += " " + cell + " |";
    md += "\n";
  }
  return md;
}

std::string comparison_csv(const Comparison& c) {
  std::string csv =
      "run,dir,optimizer,reference,metric,final_loss,final_ppl,paper_ppl,reached,upper_bound,updates_to_target,tokens_to_target,"
      "seconds_to_target,speedup_updates,speedup_tokens,speedup_time,raw_tokens_per_s,effective_tokens_per_s,"
      "optimizer_state_bytes,peak_rss_bytes,notes\n";
  for (size_t i = 0; i < c.rows.size(); ++i) {
    const CompareRow& r = c.rows[i];
    const bool ok = r.crossing.reached;
    auto num = [&](double v) { return ok ? fmt("%.6g", v) : std::string(); };
    std::string notes = r.flags;
    std::replace(notes.begin(), notes.end(), '"', '\'');
    const RunCurve& run = c.runs[r.run];
    csv += run.name + "," + run.dir + "," + run.optimizer + "," + (i == c.reference ? "1" : "0") + "," +
           metric_name(c.metric) + "," + fmt("%.6f", r.final_loss) + "," + fmt("%.4f", std::exp(r.final_loss)) + "," +
           (run.paper_ppl > 0 ? fmt("%.2f", run.paper_ppl) : "") + "," + (ok ? "1" : "0") + "," + (r.crossing.at_first_point ? "1" : "0") + "," + num(r.crossing.steps) + "," +
           num(r.crossing.tokens) + "," + num(r.crossing.seconds) + "," + num(r.speedup_steps) + "," +
           num(r.speedup_tokens) + "," + num(r.speedup_time) + "," + fmt("%.1f", r.raw_tokens_per_s) + "," +
           num(r.effective_tokens_per_s) + "," + std::to_string(run.state_bytes) + "," +
           std::to_string(run.peak_rss_bytes) + ",\"" + notes + "\"\n";
  }
  return csv;
}

std::string comparison_text(const Comparison& c) {
  std::vector<std::vector<std::string>> table = {headers()};
  for (size_t i = 0; i < c.rows.size(); ++i) table.push_back(cells(c, c.rows[i], i == c.reference));
  // Display width: "≤" and "—" are one column but three bytes.
  auto width = [](const std::string& s) {
    size_t w = 0;
    for (unsigned char ch : s) w += (ch & 0xC0) != 0x80;
    return w;
  };
  std::vector<size_t> w(headers().size(), 0);
  for (const auto& row : table)
    for (size_t k = 0; k + 1 < row.size(); ++k) w[k] = std::max(w[k], width(row[k]));
  std::string out = preamble(c);
  for (const auto& row : table) {
    std::string line;
    for (size_t k = 0; k < row.size(); ++k) {
      line += row[k];
      if (k + 1 < row.size()) line += std::string(w[k] - width(row[k]) + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string write_comparison(const Comparison& c, const std::string& out_dir, const std::string& stem, bool quiet) {
  make_directories(out_dir);
  const std::string base = out_dir + "/" + stem;
  write_text_file_atomic(base + ".md", comparison_markdown(c));
  write_text_file_atomic(base + ".csv", comparison_csv(c));
  json curves = {{"metric", metric_name(c.metric)}, {"target", c.target}, {"reference", c.runs[c.reference].name}};
  for (const CompareRow& r : c.rows) {
    json cross = r.crossing.reached ? json{{"tokens", r.crossing.tokens}, {"seconds", r.crossing.seconds}} : json();
    const RunCurve& run = c.runs[r.run];
    curves["runs"].push_back({{"name", run.name},       {"optimizer", run.optimizer}, {"tokens", run.tokens},
                              {"seconds", run.seconds}, {"loss", run.loss},           {"crossing", cross}});
  }
  write_text_file_atomic(base + ".json", curves.dump() + "\n");
  const std::string cmd = "/usr/bin/python3 '" + std::string(MULTINORM_SOURCE_DIR) + "/scripts/plot_comparison.py' '" +
                          base + ".json' --out '" + base + ".png' > /dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    if (!quiet) std::fprintf(stderr, "compare: plot skipped (python3-matplotlib missing?)\n");
    return "";
  }
  return base + ".png";
}

std::vector<std::vector<RunCurve>> group_comparable(std::vector<RunCurve> runs) {
  std::vector<std::vector<RunCurve>> groups;
  for (RunCurve& r : runs) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.front().comparability == r.comparability; });
    if (it != groups.end()) {
      it->push_back(std::move(r));
    } else {
      groups.emplace_back();
      groups.back().push_back(std::move(r));
    }
  }
  return groups;
}

}  // namespace multinorm
