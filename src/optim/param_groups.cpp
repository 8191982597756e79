#include "multinorm/param_groups.h"

#include "multinorm/error.h"
#include "multinorm/optimizer.h"

namespace multinorm {

int optimizer_state_slots(OptimizerKind optimizer, double momentum) {
  OptimizerConfig c;
  c.momentum = momentum;
  return make_rule(optimizer, c)->state_slots();
}

std::vector<ParamAssignment> assign_optimizers(const std::vector<TensorSpec>& specs, OptimizerKind matrix_optimizer, OptimizerKind fallback,
                                               const std::vector<std::string>& matrix_params) {
  std::vector<ParamAssignment> out;
  out.reserve(specs.size());
  const bool needs_2d = make_rule(matrix_optimizer, OptimizerConfig{})->matrices_only();
  for (const auto& s : specs) {
    bool matrix = false;
    for (const auto& pattern : matrix_params)
      if (glob_match(pattern, s.name)) {
        matrix = true;
        break;
      }
    if (matrix && needs_2d && s.shape.size() != 2)
      throw ConfigError("optimizer.matrix_params: pattern matches '" + s.name + "', which is not a matrix; " +
                        choice_name(matrix_optimizer) + " takes 2-D weights only");
    out.push_back({&s, matrix ? matrix_optimizer : fallback, matrix});
  }
  return out;
}

std::vector<ParamAssignment> assign_optimizers(const std::vector<TensorSpec>& specs, const OptimizerConfig& opt) {
  return assign_optimizers(specs, opt.name, opt.fallback, opt.matrix_params);
}

}  // namespace multinorm
