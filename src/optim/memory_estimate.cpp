#include "multinorm/memory_estimate.h"

#include <omp.h>

#include <algorithm>
#include <map>

#include "multinorm/cuda_scratch.h"
#include "multinorm/backend.h"
#include "multinorm/llama_model.h"
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

OptimizerMemory optimizer_memory(const std::vector<TensorSpec>& specs, OptimizerKind matrix_optimizer,
                                 OptimizerKind fallback, const std::vector<std::string>& matrix_params,
                                 double momentum, int64_t weight_dtype_bytes, int64_t state_dtype_bytes) {
  OptimizerMemory mem;
  mem.label = choice_name(matrix_optimizer);
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
  for (const OptimizerKind k : {OptimizerKind::Adam, OptimizerKind::SinkGD, OptimizerKind::Swan})
    rows.push_back(optimizer_memory(specs, k, OptimizerKind::Adam, patterns, 0.0, 2, 2));
  return rows;
}

namespace {
// The tensor table in the CUDA backend's arenas (layout_arena: the down projection's rows padded
// where F's are off 16 bytes).
std::vector<TensorSpec> cuda_arena(const ModelConfig& m, DType act, DType grad) {
  std::vector<TensorSpec> specs = llama_parameters(m);
  layout_arena(specs, cuda_activation_layout(act).pad_mlp_rows, dtype_bytes(act), dtype_bytes(grad));
  return specs;
}
}  // namespace

std::vector<GemmCall> cuda_training_gemm_calls(const ModelConfig& m, int64_t BT, DType act, DType grad) {
  namespace cs = cuda_scratch;
  const int64_t C = m.hidden_size, F = m.intermediate_size, V = m.vocab_size;
  const int64_t a = dtype_bytes(act), g = dtype_bytes(grad);
  const int layers = static_cast<int>(m.num_hidden_layers);
  // The MLP's activations' row strides in the CUDA plan (activation_plan.cpp): s [BT, F], gate_up [BT, 2F].
  const bool padded = cuda_activation_layout(act).pad_mlp_rows && cs::mlp_rows_padded(F, a);
  const int64_t s_ld = padded ? cs::gemm_staged_ld(F, a) : 0, gu_ld = padded ? cs::mlp_gate_up_ld(F, a) : 0;
  // The down projection's weight and gradient rows in the arenas.
  const std::vector<TensorSpec> specs = cuda_arena(m, act, grad);
  const auto down = std::find_if(specs.begin(), specs.end(), [](const TensorSpec& t) { return t.role == TensorRole::MlpDown; });
  const int64_t w_ld = down != specs.end() ? down->arena_ld : 0;
  std::vector<GemmCall> calls;
  // A call, or `count` more of one already added under its name and shape (the loss head's row chunks repeat theirs).
  auto add = [&](const std::string& name, int count, const GemmShape& s, int64_t out, int64_t a_ld = 0, int64_t b_ld = 0, int64_t out_ld = 0) {
    GemmCall c{name, count, s.M, s.N, s.K, s.trans_a, s.trans_b, s.accumulate, a, out, a_ld, b_ld, out_ld};
    for (GemmCall& d : calls)
      if (d.name == c.name && d.M == c.M && d.N == c.N && d.K == c.K) return void(d.count += count);
    calls.push_back(c);
  };
  // A projection (Linear): its input x's, its output y's (and the output's gradient dy's) and its
  // weight's (and weight gradient's) row strides.
  auto linear = [&](const std::string& name, int64_t in, int64_t out, int64_t N, int64_t input_gradient, int64_t x_ld, int64_t y_ld,
                    bool accumulate_input = false, int64_t w_ld = 0) {
    auto three = Linear::gemms(in, out, N, 1);
    three[1].accumulate = accumulate_input;
    add(name + " forward", layers, three[0], a, x_ld, w_ld, y_ld);                    // y = x W^T
    add(name + " backward_input", layers, three[1], input_gradient, y_ld, w_ld, x_ld);  // dx = dy W
    add(name + " backward_weight", layers, three[2], g, y_ld, x_ld, w_ld);            // dW += dy^T x
  };
  linear("qkv", C, 3 * C, BT, 4, 0, 0), linear("o", C, C, BT, a, 0, 0);
  if (padded) {  // by halves (Linear::halves): gate and up each over E rows of W (F and zero rows), the up half's dx added to the gate half's
    const int64_t E = cs::mlp_up_column(F, gu_ld, a);  // Linear::extent
    linear("gate", C, E, BT, 4, 0, gu_ld);
    linear("up", C, E, BT, 4, 0, gu_ld, true);
  } else {
    linear("gate_up", C, 2 * F, BT, 4, 0, 0);
  }
  linear("down", F, C, BT, a, s_ld, 0, false, w_ld);
  for (int64_t r0 = 0; r0 < BT; r0 += kHeadChunkRows) {
    const int64_t R = std::min(kHeadChunkRows, BT - r0);
    const auto head = Linear::gemms(C, V, R, 1);
    if (cuda_fuses_loss_head(act, act, true, act)) {
      const VocabChunks chunks = fused_loss_head_chunks(R, V);
      for (int64_t v0 = 0; v0 < V; v0 += chunks.width) add("lm_head forward (a vocabulary chunk)", 1, {R, std::min(chunks.width, V - v0), C, false, true, 1}, 4);
    } else {
      add("lm_head forward", 1, head[0], 4);
    }
    add("lm_head backward_input", 1, head[1], 4), add("lm_head backward_weight", 1, head[2], g);  // d_lnf (FP32), dWlm
  }
  return calls;
}

cuda_scratch::GemmStaging cuda_gemm_call_staging(const GemmCall& c, const ActivationLayout& layout) {
  const bool pad = layout.pad_mlp_rows;
  return cuda_scratch::gemm_staging(c.M, c.N, c.K, c.ta, c.tb, c.in, c.out, 0, 0, 0, pad ? c.a_ld : 0, pad ? c.b_ld : 0, pad ? c.out_ld : 0);
}

int64_t cuda_backend_scratch_bytes(const ModelConfig& m, int64_t B, int64_t T, DType act, DType grad, OptimizerKind matrix_optimizer,
                                   const std::vector<std::string>& matrix_params, SwanProducts swan_products) {
  namespace cs = cuda_scratch;  // the sizes the backend allocates by (include/multinorm/cuda_scratch.h)
  const int64_t C = m.hidden_size, H = m.num_attention_heads, BT = B * T;
  // GEMM operands staged through 128-byte rows: one buffer per role (a, b, out), the largest need.
  int64_t staging[3] = {0, 0, 0};
  const ActivationLayout layout = cuda_activation_layout(act);
  for (const GemmCall& c : cuda_training_gemm_calls(m, BT, act, grad)) {
    const cs::GemmStaging st = cuda_gemm_call_staging(c, layout);
    staging[0] = std::max(staging[0], st.a.staged_bytes(c.in));
    staging[1] = std::max(staging[1], st.b.staged_bytes(c.in));
    staging[2] = std::max(staging[2], st.out.staged_bytes(c.out));
  }
  int64_t optimizer = 0;  // one buffer, grown to the largest need
  // SinkGD's launches hold the scratch of all their tensors (sinkgd_many_launch_end): at most the
  // cap or all of the matrices' together, or one tensor that alone needs more. An upper bound for
  // any share of the matrices a data-parallel rank updates, and exact where they fit one launch.
  int64_t sinkgd_all = 0, sinkgd_largest = 0;
  std::vector<cs::SwanShape> swan;  // every matrix in one call, as the optimizer passes them
  int64_t padded = 0;               // an element-wise rule's dense copies of a matrix with padded rows (elementwise_padded)
  const std::vector<TensorSpec> specs = cuda_arena(m, act, grad);  // outlives the assignments, which point into it
  const int64_t tensors = static_cast<int64_t>(specs.size());  // sum_squares_many: one result each
  for (const auto& a : assign_optimizers(specs, matrix_optimizer, OptimizerKind::Adam, matrix_params)) {
    if (a.tensor->arena_ld && a.optimizer != OptimizerKind::SinkGD && a.optimizer != OptimizerKind::Swan)
      padded = std::max(padded, cs::padded_rule_bytes(a.tensor->numel(), dtype_bytes(act), dtype_bytes(grad)));
    if (!a.matrix) continue;
    const int64_t r = a.tensor->rows(), c = a.tensor->cols();
    if (matrix_optimizer == OptimizerKind::SinkGD) {
      sinkgd_all += cs::sinkgd_floats(r, c), sinkgd_largest = std::max(sinkgd_largest, cs::sinkgd_floats(r, c));
    } else if (matrix_optimizer == OptimizerKind::Swan) {
      swan.push_back({r, c, 0, cs::swan_split_tf32(swan_split_from_k(swan_products), std::min(r, c))});
    }
  }
  optimizer = std::max(optimizer, cs::swan_plan(swan).scratch_bytes);
  optimizer = std::max(optimizer, std::max(sinkgd_largest, std::min(sinkgd_all, cs::kSinkgdManyFloats)) * 4);
  // The fused loss head's statistics (BF16; FP32 runs the GEMM and cross_entropy): a (max, sum) per
  // row and vocabulary chunk, a target logit per row.
  const int64_t R = std::min(BT, kHeadChunkRows);
  const int64_t head = cuda_fuses_loss_head(act, act, true, act) ? R * fused_loss_head_chunks(R, m.vocab_size).count * 8 + R * 4 : 0;
  return cs::kGemmWorkspaceBytes + cs::rmsnorm_backward_floats(BT, C) * 4 + cs::attention_backward_bytes(B, H, T) +
         cs::embedding_backward_bytes(BT, C) + cs::sum_squares_many_bytes(tensors) + optimizer + padded + head + cs::kDescriptorCacheBytes +
         staging[0] + staging[1] + staging[2];
}

ActivationPlan training_activation_plan(const RunConfig& run, bool cuda) {
  const DType act = run.precision.params;
  return plan_activations(run.model, run.batch.micro_batch, run.batch.seq_len, act,
                          cuda ? cuda_activation_layout(act) : cpu_activation_layout(act));
}

namespace {
// The matrix optimizer's tensors, in tensor order.
std::vector<MatrixShape> matrix_shapes(const std::vector<TensorSpec>& specs, const OptimizerConfig& o) {
  std::vector<MatrixShape> shapes;
  for (const auto& a : assign_optimizers(specs, o.name, OptimizerKind::Adam, o.matrix_params))
    if (a.matrix) shapes.push_back({a.tensor->rows(), a.tensor->cols()});
  return shapes;
}
}  // namespace

TrainingMemory training_memory(const RunConfig& run, bool cuda) {
  const auto specs = llama_parameters(run.model);
  const OptimizerMemory om = optimizer_memory(specs, run.optimizer.name, run.optimizer.fallback,
                                              run.optimizer.matrix_params, run.optimizer.momentum,
                                              dtype_bytes(run.precision.params), dtype_bytes(run.precision.optimizer_states));
  // The arenas: the CUDA backend's pads the down projection's rows where F's are off 16 bytes.
  const int64_t elements = cuda ? arena_elements(cuda_arena(run.model, run.precision.params, run.precision.grads)) : count_parameters(specs);
  TrainingMemory t;
  t.weights = om.weight_bytes + (elements - count_parameters(specs)) * dtype_bytes(run.precision.params);
  t.grads = elements * dtype_bytes(run.precision.grads);
  t.states = om.state_bytes;
  t.activations = training_activation_plan(run, cuda).bytes();
  t.cuda = cuda;
  t.backend_scratch = cuda ? cuda_backend_scratch_bytes(run.model, run.batch.micro_batch, run.batch.seq_len, run.precision.params,
                                                        run.precision.grads, run.optimizer.name, run.optimizer.matrix_params,
                                                        run.optimizer.swan.ns_products)
                           : cpu_backend_scratch_bytes(run.model, run.batch.micro_batch, run.batch.seq_len, run.precision.params,
                                                       run.precision.grads, run.optimizer.name, matrix_shapes(specs, run.optimizer),
                                                       run.optimizer.swan.whitening == SwanWhitening::Eigh,
                                                       run.threads > 0 ? static_cast<int>(run.threads) : omp_get_num_procs());
  return t;
}

}  // namespace multinorm
