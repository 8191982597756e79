// The paper's figures, matched by recipe (include/multinorm/paper_figures.h).
#include "multinorm/paper_figures.h"

#include <filesystem>
#include <vector>

#include "multinorm/install_paths.h"
#include "multinorm/run_config.h"

namespace multinorm {

namespace {

// What makes two runs the same experiment (the batch's split over ranks aside).
json recipe_of(const json& r) {
  return {{"model", r["model"]["config"]},
          {"global_batch", r["batch"]["global_batch"]},
          {"seq_len", r["batch"]["seq_len"]},
          {"loss_normalization", r["batch"]["loss_normalization"]},
          {"optimizer", used_optimizer_settings(r["optimizer"])},
          {"schedule", r["schedule"]},
          {"params", r["precision"]["params"]},
          {"layout", r["data"]["layout"]}};
}

// The shipped configs/c4 run configs: a bundle's share/multinorm, else the source tree's.
std::vector<std::string> shipped_configs() {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const std::string& dir : {executable_dir() + "/../share/multinorm/configs/c4", std::string(MULTINORM_SOURCE_DIR) + "/configs/c4"}) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".json") files.push_back(e.path().string());
    if (!files.empty()) break;
  }
  return files;
}

}  // namespace

std::optional<PaperFigure> paper_figure(const json& resolved) {
  static const std::vector<std::pair<PaperFigure, json>> known = [] {
    std::vector<std::pair<PaperFigure, json>> v;
    for (const std::string& f : shipped_configs()) {
      const RunConfig c = load_run_config(f);
      const json& p = c.resolved["paper"];
      if (p["perplexity"].get<double>() > 0)
        v.push_back({{f, p["row"].get<std::string>(), p["table"].get<std::string>(), p["perplexity"].get<double>()}, recipe_of(c.resolved)});
    }
    return v;
  }();
  if (!resolved.contains("model") || !resolved.contains("batch") || !resolved.contains("paper")) return std::nullopt;
  const json mine = recipe_of(resolved);
  for (const auto& [figure, recipe] : known)
    if (recipe == mine) return figure;
  return std::nullopt;
}

}  // namespace multinorm
