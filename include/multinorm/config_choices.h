// Every choice a run config makes by name, as an enum: the names (in enum order) are the schema's
// choices (run_schema() takes them from here, so docs/configs.md lists them), run_config_from_json
// parses each once, and code compares enums, never strings. choice_name() gives the name back (logs,
// result.json); parse_choice() is the one parser (a ConfigError listing the choices).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "multinorm/error.h"

namespace multinorm {

// The optimizers, matrix or fallback (src/optim/registry.cpp builds each one's rule).
enum class OptimizerKind : uint8_t { SinkGD, Swan, Adam, AdamW, Sgd };
inline const std::vector<std::string>& choice_names(OptimizerKind) {
  static const std::vector<std::string> n{"sinkgd", "swan", "adam", "adamw", "sgd"};
  return n;
}
// divergence.action: what a trip does (divergence.h).
enum class DivergenceAction : uint8_t { Stop, Skip, Rollback };
inline const std::vector<std::string>& choice_names(DivergenceAction) {
  static const std::vector<std::string> n{"stop", "skip", "rollback"};
  return n;
}
// batch.loss_normalization: the mean of micro-batch means (GaLore) or the token mean.
enum class LossNormalization : uint8_t { MicroBatchMean, TokenMean };
inline const std::vector<std::string>& choice_names(LossNormalization) {
  static const std::vector<std::string> n{"micro_batch_mean", "token_mean"};
  return n;
}
// backend: where a run trains (device.h: choose_backend).
enum class BackendRequest : uint8_t { Auto, Cpu, Cuda };
inline const std::vector<std::string>& choice_names(BackendRequest) {
  static const std::vector<std::string> n{"auto", "cpu", "cuda"};
  return n;
}
// optimizer.rounding: how BF16 weights are written back.
enum class Rounding : uint8_t { Nearest, Stochastic };
inline const std::vector<std::string>& choice_names(Rounding) {
  static const std::vector<std::string> n{"nearest", "stochastic"};
  return n;
}
// optimizer.swan.row_norm and optimizer.swan.whitening.
enum class SwanRowNorm : uint8_t { L2, Standardize };
inline const std::vector<std::string>& choice_names(SwanRowNorm) {
  static const std::vector<std::string> n{"l2", "standardize"};
  return n;
}
enum class SwanWhitening : uint8_t { NewtonSchulz, Eigh };
inline const std::vector<std::string>& choice_names(SwanWhitening) {
  static const std::vector<std::string> n{"newton_schulz", "eigh"};
  return n;
}
// optimizer.swan.ns_products: Newton-Schulz's products on a GPU in FP32, or each as three TF32
// tensor-core products of split operands (hi + lo), or split from a Gram size on (cuda_scratch::swan_split_tf32).
enum class SwanProducts : uint8_t { Auto, Fp32, SplitTf32 };
inline const std::vector<std::string>& choice_names(SwanProducts) {
  static const std::vector<std::string> n{"auto", "fp32", "split_tf32"};
  return n;
}
// schedule.kind: the learning-rate multiplier after the warm-up.
enum class ScheduleKind : uint8_t { Cosine, Linear, Constant };
inline const std::vector<std::string>& choice_names(ScheduleKind) {
  static const std::vector<std::string> n{"cosine", "linear", "constant"};
  return n;
}
// (data.layout is the shards' own ShardLayout, shard.h.)

template <class E>
const std::string& choice_name(E e) {
  return choice_names(E{})[static_cast<size_t>(e)];
}
template <class E>
E parse_choice(const std::string& name, const std::string& what) {
  const std::vector<std::string>& names = choice_names(E{});
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<E>(i);
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  throw ConfigError(what + ": unknown choice '" + name + "' (" + list + ")");
}

}  // namespace multinorm
