// The optimizer registry: name -> factory. Adding an optimizer = its file + one line here (and its
// name in the optimizer.name / optimizer.fallback choices of the run schema).
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
const std::map<std::string, RuleFactory>& registry() {
  static const std::map<std::string, RuleFactory> r = {
      {"sinkgd", make_sinkgd}, {"swan", make_swan}, {"adam", make_adam}, {"adamw", make_adamw}, {"sgd", make_sgd},
  };
  return r;
}
}  // namespace

std::vector<std::string> registered_rules() {
  std::vector<std::string> names;
  for (const auto& [name, f] : registry()) names.push_back(name);
  return names;
}

std::unique_ptr<TensorRule> make_rule(const std::string& name, const OptimizerConfig& config) {
  auto it = registry().find(name);
  if (it == registry().end()) {
    std::string known;
    for (const auto& n : registered_rules()) known += (known.empty() ? "" : ", ") + n;
    throw ConfigError("unknown optimizer '" + name + "' (known: " + known + ")");
  }
  return it->second(config);
}

}  // namespace multinorm
