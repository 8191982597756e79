#include "multinorm/memory_estimate.h"

#include "multinorm/param_groups.h"

namespace multinorm {

namespace {
std::vector<std::string> paper_matrix_patterns() {
  return {"model.layers.*.self_attn.q_proj.weight", "model.layers.*.self_attn.k_proj.weight",
          "model.layers.*.self_attn.v_proj.weight", "model.layers.*.self_attn.o_proj.weight",
          "model.layers.*.mlp.gate_proj.weight",    "model.layers.*.mlp.up_proj.weight",
          "model.layers.*.mlp.down_proj.weight"};
}
}  // namespace

OptimizerMemory optimizer_memory(const std::vector<TensorSpec>& specs, const std::string& matrix_optimizer,
                                 const std::string& fallback, const std::vector<std::string>& matrix_params,
                                 double momentum, int64_t weight_dtype_bytes, int64_t state_dtype_bytes) {
  OptimizerMemory mem;
  mem.label = matrix_optimizer;
  for (const auto& a : assign_optimizers(specs, matrix_optimizer, fallback, matrix_params)) {
    const int64_t n = a.tensor->numel();
    const int64_t state = n * optimizer_state_slots(a.optimizer, momentum) * state_dtype_bytes;
    mem.weight_bytes += n * weight_dtype_bytes;
    mem.state_bytes += state;
    if (a.matrix) mem.matrix_state_bytes += state;
  }
  return mem;
}

std::vector<OptimizerMemory> paper_memory_table(const ModelConfig& m) {
  const auto specs = llama_parameters(m);
  const auto patterns = paper_matrix_patterns();
  std::vector<OptimizerMemory> rows;
  for (const char* name : {"adam", "sinkgd", "swan"}) rows.push_back(optimizer_memory(specs, name, "adam", patterns, 0.0, 2, 2));
  return rows;
}

TrainingMemory training_memory(const RunConfig& run) {
  const auto specs = llama_parameters(run.model);
  const OptimizerMemory om = optimizer_memory(specs, run.optimizer.name, run.optimizer.fallback,
                                              run.optimizer.matrix_params, run.optimizer.momentum,
                                              dtype_bytes(run.precision.params), dtype_bytes(run.precision.optimizer_states));
  TrainingMemory t;
  t.weights = om.weight_bytes;
  t.grads = count_parameters(specs) * dtype_bytes(run.precision.grads);
  t.states = om.state_bytes;
  t.activations = plan_activations(run.model, run.batch.micro_batch, run.batch.seq_len, run.precision.params).bytes();
  return t;
}

}  // namespace multinorm
