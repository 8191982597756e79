// The optimizer registry: kind -> factory. Adding an optimizer = its file, its OptimizerKind and name
// (config_choices.h: the schema's choices follow) and one line here.
#include <map>

#include "multinorm/error.h"
#include "multinorm/optimizer.h"

namespace multinorm {

std::unique_ptr<TensorRule> make_sinkgd(const OptimizerConfig&);
std::unique_ptr<TensorRule> make_swan(const OptimizerConfig&);
std::unique_ptr<TensorRule> make_adam(const OptimizerConfig&);
std::unique_ptr<TensorRule> make_adamw(const OptimizerConfig&);
std::unique_ptr<TensorRule> make_sgd(const OptimizerConfig&);

namespace {
const std::map<OptimizerKind, RuleFactory>& registry() {
  static const std::map<OptimizerKind, RuleFactory> r = {
      {OptimizerKind::SinkGD, make_sinkgd}, {OptimizerKind::Swan, make_swan}, {OptimizerKind::Adam, make_adam},
      {OptimizerKind::AdamW, make_adamw},   {OptimizerKind::Sgd, make_sgd},
  };
  return r;
}
}  // namespace

std::unique_ptr<TensorRule> make_rule(OptimizerKind kind, const OptimizerConfig& config) {
  auto it = registry().find(kind);
  if (it == registry().end()) throw Error("optimizer " + choice_name(kind) + " has no rule in the registry");
  return it->second(config);
}

}  // namespace multinorm
