// `multinorm bench model`: training throughput of the hand-written LLaMA, against (a) the backend's
// own BF16 GEMM throughput (AMX tiles, oneDNN or cuBLASLt) on the model's own GEMM shapes and (b) PyTorch CPU on the same model and batch,
// both measured in the same run. FLOPs per token: 6 x (GEMM parameters incl. lm_head) +
// 12 x layers x T x C (attention, counted without the causal saving), the usual convention.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>

#include "../../kernels/cpu/cpu_kernels.h"
#include "multinorm/device.h"
#include "multinorm/bench.h"
#include "multinorm/error.h"
#include "multinorm/json_file.h"
#include "multinorm/llama_model.h"
#include "multinorm/run_config.h"

namespace multinorm {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string run_command(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  ::pclose(p);
  return out;
}

}  // namespace

void bench_model(const ModelBenchOptions& o) {
  const json doc = read_json_file(o.config);
  const ModelConfig cfg = is_model_config(doc) ? load_model_config(o.config) : load_run_config(o.config).model;
  const DType dt = parse_dtype(o.precision);
  auto be = make_backend(choose_backend(o.backend), o.threads);
  const int64_t B = o.batch, T = o.seq, BT = B * T;
  LlamaModel model(*be, cfg, dt, B, T);
  model.init_random(0);

  std::mt19937 gen(1);
  std::vector<int32_t> tokens(BT), targets(BT);
  for (auto& t : tokens) t = static_cast<int32_t>(gen() % cfg.vocab_size);
  for (int64_t i = 0; i < BT; ++i) targets[i] = tokens[(i + 1) % BT];
  const MicroBatch mb{tokens.data(), targets.data(), nullptr, B, T};

  // FLOPs per token.
  int64_t gemm_params = 0;
  for (const auto& t : model.tensors())
    if (t.group() == TensorGroup::Attention || t.group() == TensorGroup::Mlp || t.group() == TensorGroup::LmHead ||
        (cfg.tie_word_embeddings && t.group() == TensorGroup::Embedding))
      gemm_params += t.numel();
  const double flops_token = 6.0 * gemm_params + 12.0 * cfg.num_hidden_layers * T * cfg.hidden_size;

  // Rounds: one training step, then the model's GEMMs on the same backend (each shape once warm, then
  // timed once), so each round's ratio compares the two under the same machine conditions. This
  // machine's speed drifts by tens of percent between seconds; timed in separate phases, the ratio
  // moved between 38% and 97% from one run to the next of one build. The ratio reported is the
  // median of the rounds'; the step time and GEMM figure shown are means.
  std::vector<void*> gemm_bufs;
  struct GemmOperands { Buf a, b, c; };
  std::vector<GemmOperands> gemm_ops;
  const auto gemms = training_step_gemms(cfg, BT);
  double gemm_flops = 0;
  for (const auto& g : gemms) {
    auto alloc = [&](int64_t n, DType t) { gemm_bufs.push_back(be->allocate(n * dtype_bytes(t))); return Buf{gemm_bufs.back(), t}; };
    gemm_ops.push_back({alloc(g.M * g.K, dt), alloc(g.K * g.N, dt), alloc(g.M * g.N, DType::F32)});
    gemm_flops += 2.0 * g.M * g.N * g.K * g.count;
  }
  auto time_gemms = [&] {  // seconds for one step's GEMMs, each shape timed warm
    double s = 0;
    for (size_t k = 0; k < gemms.size(); ++k) {
      const auto& g = gemms[k];
      const auto& op = gemm_ops[k];
      be->matmul(op.c, op.a, op.b, g.M, g.N, g.K, g.trans_a, g.trans_b, false);  // create the primitive, warm caches
      be->synchronize();  // a device backend's launches are asynchronous: time them to completion
      const auto t = Clock::now();
      be->matmul(op.c, op.a, op.b, g.M, g.N, g.K, g.trans_a, g.trans_b, false);
      be->synchronize();
      s += seconds_since(t) * g.count;
    }
    return s;
  };
  for (int64_t i = 0; i < o.warmup; ++i) model.forward_backward(mb, 1.0f / BT);
  model.profile().enabled = true;
  model.profile().reset();
  double train_total = 0, gemm_total = 0;
  std::vector<double> ratios;
  for (int64_t i = 0; i < o.steps; ++i) {
    be->synchronize();
    const auto t = Clock::now();
    model.forward_backward(mb, 1.0f / BT);
    be->synchronize();
    const double step_s = seconds_since(t), gemm_s = time_gemms();
    train_total += step_s, gemm_total += gemm_s;
    ratios.push_back((flops_token * BT / step_s) / (gemm_flops / gemm_s));
  }
  for (void* p : gemm_bufs) be->release(p);
  std::sort(ratios.begin(), ratios.end());
  const size_t half = ratios.size() / 2;
  const double ratio = ratios.size() % 2 ? ratios[half] : (ratios[half - 1] + ratios[half]) / 2;
  const double train_s = train_total / o.steps;
  const double gemm_gflops = gemm_flops / (gemm_total / o.steps) / 1e9;
  const OpProfile train_profile = model.profile();
  model.profile().enabled = false;
  auto t0 = Clock::now();
  for (int64_t i = 0; i < o.steps; ++i) model.forward(mb);
  const double fwd_s = seconds_since(t0) / o.steps;
  const double bwd_s = train_s - fwd_s;
  const double train_tps = BT / train_s;
  const double achieved = flops_token * train_tps / 1e9;

  // (b) PyTorch on the same model and batch.
  double torch_tps = 0;
  std::string torch_mode = "not measured";
  if (o.torch != "off") {
    const std::string script = std::string(MULTINORM_SOURCE_DIR) + "/bench/torch_llama.py";
    // PyTorch's bundled oneDNN is capped below AMX as ours is (its AMX kernels die with SIGILL here).
    const std::string cmd = "ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 /usr/bin/python3 " + script + " --config " + o.config + " --batch " + std::to_string(B) +
                            " --seq " + std::to_string(T) + " --threads " + std::to_string(be->threads()) +
                            " --steps " + std::to_string(o.steps) + " 2>/dev/null";
    const std::string out = run_command(cmd);
    const json r = json::parse(out, nullptr, false);
    if (r.is_object() && r.contains("best_tokens_per_s")) {
      torch_tps = r["best_tokens_per_s"].get<double>();
      torch_mode = r["best_mode"].get<std::string>();
    } else {
      torch_mode = "unavailable (python3-torch missing or the script failed)";
    }
  }

  // The CPU attention's heads are whole (one thread each) or split over threads (attention.cpp).
  const bool split_heads = cpu::attention_splits_per_head(B * cfg.num_attention_heads, T, be->threads()) > 1;
  // What the GEMM figure was measured on: the backend's own GEMM path.
  const std::string engine = !be->host_memory() ? "cuBLASLt" : o.precision == "bf16" ? cpu_bf16_gemm_engine() : "oneDNN";
  if (o.json) {
    json j = {{"model", cfg.name}, {"gemm_engine", engine}, {"batch", B}, {"seq", T}, {"threads", be->threads()}, {"precision", o.precision},
              {"train_tokens_per_s", train_tps}, {"forward_tokens_per_s", BT / fwd_s}, {"backward_s", bwd_s},
              {"gflops", achieved}, {"gemm_peak_gflops", gemm_gflops}, {"ratio_to_gemm_peak", ratio},
              {"ratio_to_gemm_peak_rounds", ratios},
              {"torch_tokens_per_s", torch_tps}, {"torch_mode", torch_mode},
              {"ratio_to_torch", torch_tps > 0 ? train_tps / torch_tps : 0.0}};
    if (be->host_memory()) j["attention_flops_share"] = cpu::attention_blocked_flops_share(T, split_heads);
    for (size_t i = 0; i < train_profile.seconds.size(); ++i)
      j["profile_s"][op_name(static_cast<Op>(i))] = train_profile.seconds[i] / o.steps;
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("bench model: %s, micro-batch %lld x %lld, %s, backend %s, %d threads, %lld steps after %lld warm-up\n",
              cfg.name.c_str(), (long long)B, (long long)T, o.precision.c_str(), be->name().c_str(), be->threads(), (long long)o.steps,
              (long long)o.warmup);
  std::printf("  %.1f MFLOP per token (6 x %lld GEMM params + 12 x L x T x C)\n", flops_token / 1e6, (long long)gemm_params);
  std::printf("  forward            %9.3f s   %10.0f tokens/s\n", fwd_s, BT / fwd_s);
  std::printf("  backward           %9.3f s\n", bwd_s);
  std::printf("  train step         %9.3f s   %10.0f tokens/s   %7.1f GFLOP/s\n", train_s, train_tps, achieved);
  std::printf("  %s GEMM (%s) on the model's shapes: %.1f GFLOP/s -> model reaches %.0f%% of it\n"
              "    (the median of %zu interleaved rounds' ratios, which ran %.0f%% to %.0f%%; step and GEMM figures are means)\n",
              o.precision.c_str(), engine.c_str(), gemm_gflops, 100.0 * ratio, ratios.size(), 100.0 * ratios.front(),
              100.0 * ratios.back());
  if (torch_tps > 0)
    std::printf("  PyTorch CPU (%s): %.0f tokens/s -> multinorm is %.2fx PyTorch\n", torch_mode.c_str(), torch_tps,
                train_tps / torch_tps);
  else
    std::printf("  PyTorch CPU: %s\n", torch_mode.c_str());
  if (be->host_memory()) {  // the CPU attention's blocks (kernels/cpu/attention.cpp)
    const double n = static_cast<double>((T + 31) / 32), causal = (n + 1) / (2 * n);
    std::printf("  attention computes %.0f%% of the 12 x L x T x C counted above: blocks up to the diagonal skip %.0f%%,\n"
                "    recomputing S in the backward adds %.0f%%%s\n",
                100.0 * cpu::attention_blocked_flops_share(T, split_heads), 100.0 * (1 - causal),
                100.0 * (split_heads ? 3 : 1) * causal / 6,
                split_heads ? " (heads split over threads: S and dP again in a query pass)" : "");
  }
  std::printf("  where a training step's time goes:\n");
  double total = 0;
  for (double s : train_profile.seconds) total += s;
  for (size_t i = 0; i < train_profile.seconds.size(); ++i) {
    const double s = train_profile.seconds[i] / o.steps;
    std::printf("    %-14s %8.4f s  %5.1f%%\n", op_name(static_cast<Op>(i)), s, 100.0 * train_profile.seconds[i] / total);
  }
}

}  // namespace multinorm
