// Which optimizer updates which parameter. The paper: the matrix optimizer (SinkGD or SWAN) takes
// the linear weights inside the blocks; embedding, norms and lm_head take Adam at the global lr.
#pragma once
#include <string>
#include <vector>

#include "multinorm/model_spec.h"
#include "multinorm/run_config.h"

namespace multinorm {

struct ParamAssignment {
  const TensorSpec* tensor;
  OptimizerKind optimizer;
  bool matrix;            // matched optimizer.matrix_params (runs at lr_t * alpha)
};

// Assigns every tensor: a tensor matching one of `matrix_params` goes to `matrix_optimizer`, the rest
// to `fallback`. SinkGD and SWAN need 2-D tensors: a 1-D match is an error naming it.
std::vector<ParamAssignment> assign_optimizers(const std::vector<TensorSpec>& specs, OptimizerKind matrix_optimizer, OptimizerKind fallback,
                                               const std::vector<std::string>& matrix_params);
std::vector<ParamAssignment> assign_optimizers(const std::vector<TensorSpec>& specs, const OptimizerConfig& opt);

// Per-element state tensors an optimizer keeps: Adam/AdamW 2 (m, v), SGD 1 with momentum else 0,
// SinkGD and SWAN 0 (stateless).
int optimizer_state_slots(OptimizerKind optimizer, double momentum = 0.0);

}  // namespace multinorm
