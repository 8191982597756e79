// The paper's published figure for a run: configs/c4/*.json carry a `paper` section (row, table,
// perplexity), and a run whose recipe is one of theirs gets that figure beside its own (`compare`).
#pragma once
#include <optional>
#include <string>

#include "multinorm/schema.h"

namespace multinorm {

struct PaperFigure {
  std::string config;  // the shipped config it matches (configs/c4/llama_60m_sinkgd.json)
  std::string row, table;
  double perplexity = 0;
};

// The shipped config whose recipe `resolved` (a run's config.json) matches: the same model, global
// batch, sequence length, loss normalisation, optimizer, schedule, weight precision and data layout.
// The micro-batch (how the batch is split over GPUs), data paths, seed and backend may differ.
std::optional<PaperFigure> paper_figure(const json& resolved);

}  // namespace multinorm
