// `multinorm compare RUN_DIR... [--reference RUN_DIR] [--metric val_loss|train_loss] [--out DIR]`.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "multinorm/cli.h"
#include "multinorm/compare.h"
#include "multinorm/error.h"

namespace multinorm {

namespace {

std::string parent_of(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const auto slash = dir.find_last_of('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : dir.substr(0, slash);
}

}  // namespace

void add_compare_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "compare", "Optimizer comparison of runs: updates, tokens and time to the reference's final loss, "
                 "effective throughput, memory (Markdown, CSV, plot)");
  cmd->footer("Example: multinorm compare runs/c4_llama_60m_adam runs/c4_llama_60m_sinkgd runs/c4_llama_60m_swan");
  static std::vector<std::string> dirs;
  static std::string reference, metric = "val_loss", out, stem = "comparison";
  static int window = 20;
  static bool allow_mismatch = false, quiet = false;
  cmd->add_option("runs", dirs, "run directories (each with config.json and metrics.jsonl)")->required();
  cmd->add_option("--reference", reference,
                  "the run whose final loss is the target (default: the Adam run with the lowest final loss)");
  cmd->add_option("--metric", metric, "val_loss (evaluations) or train_loss (trailing mean of --window updates)")
      ->check(CLI::IsMember({"val_loss", "train_loss"}));
  cmd->add_option("--window", window, "updates averaged for train_loss")->check(CLI::PositiveNumber);
  cmd->add_option("--out", out, "where comparison.{md,csv,json,png} go (default: the runs' common parent directory)");
  cmd->add_option("--stem", stem, "file name stem of the outputs");
  cmd->add_flag("--allow-mismatch", allow_mismatch,
                "keep runs whose model, data, batch or evaluation differ from the reference, flagged");
  cmd->add_flag("--quiet", quiet, "print nothing but errors");
  cmd->callback([] {
    const CompareMetric m = metric == "val_loss" ? CompareMetric::ValLoss : CompareMetric::TrainLoss;
    std::vector<std::string> all = dirs;
    // The reference joins the runs unless it is one of them (under any spelling of its path).
    auto same = [](const std::string& x, const std::string& y) {
      std::error_code ec;
      return std::filesystem::equivalent(x, y, ec);
    };
    if (!reference.empty() && std::none_of(all.begin(), all.end(), [&](const auto& d) { return same(d, reference); }))
      all.push_back(reference);
    std::vector<RunCurve> runs;
    for (const auto& d : all) runs.push_back(load_run_curve(d, m, window));
    const Comparison c = compare_runs(std::move(runs), reference, m, allow_mismatch);
    std::string dir = out;
    if (dir.empty()) {
      dir = parent_of(all.front());
      for (const auto& d : all)
        if (parent_of(d) != dir) throw ConfigError("compare: the runs have no common parent directory: give --out DIR");
    }
    const std::string png = write_comparison(c, dir, stem, quiet);
    if (quiet) return;
    std::printf("%s\n", comparison_text(c).c_str());
    std::printf("written: %s/%s.md, .csv, .json%s\n", dir.c_str(), stem.c_str(), png.empty() ? "" : (", " + png).c_str());
  });
}

}  // namespace multinorm
