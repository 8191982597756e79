// `multinorm bench model`: training throughput of the hand-written LLaMA, against (a) the backend's
// own BF16 GEMM throughput (AMX tiles, oneDNN or cuBLASLt) on the model's own GEMM shapes and (b) PyTorch CPU on the same model and batch,
// both measured in the same run. FLOPs per token: 6 x (GEMM parameters incl. lm_head) +
// 12 x layers x T x C (attention, counted without the causal saving), the usual convention.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>

#include "../../kernels/common/optim_math.h"
#include "../../kernels/cpu/cpu_kernels.h"
#include "multinorm/device.h"
#include "multinorm/bench.h"
#include "multinorm/error.h"
#include "multinorm/json_file.h"
#include "multinorm/kernel_costs.h"
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

// The run config the bench's model and optimizer come from: the file's, or the defaults around a model config.
RunConfig bench_run_config(const std::string& path, const std::string& precision) {
  const json doc = read_json_file(path);
  json run_doc = is_model_config(doc) ? json{{"model", {{"config", doc}}}} : load_run_config(path).resolved;
  run_doc["precision"]["params"] = precision;
  RunConfig run = run_config_from_json(run_doc, path);
  if (is_model_config(doc)) run.model.name = load_model_config(path).name;
  return run;
}

void print_roofline(const std::vector<KernelCost>& ks, const DevicePeak& peak, const RooflineAssumptions& a) {
  std::vector<std::pair<double, const KernelCost*>> rows;
  double step = 0;
  for (const auto& k : ks) {
    rows.push_back({roofline_seconds(k, peak, a), &k});
    step += rows.back().first;
  }
  std::sort(rows.begin(), rows.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  std::printf("    %-30s %8s %10s %10s %9s %10s  %-7s %6s\n", "kernel", "launches", "MB", "GFLOP", "FLOP/B", "time us", "bound", "share");
  for (const auto& [sec, k] : rows)
    std::printf("    %-30s %8lld %10.2f %10.3f %9.1f %10.1f  %-7s %5.1f%%\n", k->name.c_str(), (long long)k->launches, k->bytes / 1e6,
                k->flops / 1e9, k->bytes > 0 ? k->flops / k->bytes : 0.0, sec * 1e6, roofline_memory_bound(*k, peak, a) ? "memory" : "compute",
                step > 0 ? 100.0 * sec / step : 0.0);
}

// The GPU's assumed fractions of peak, with the command line's overrides.
RooflineAssumptions roofline_assumptions(const DevicePeak& peak, const ModelBenchOptions& o) {
  RooflineAssumptions a = peak.assume;
  if (o.gemm_efficiency > 0) a.gemm = o.gemm_efficiency;
  if (o.attention_efficiency > 0) a.attention = o.attention_efficiency;
  return a;
}

bool is_attention(const std::string& name) { return name.rfind("attention_", 0) == 0; }
bool is_gemm(const KernelCost& k) { return k.unit == CostUnit::GemmTensorCore || k.unit == CostUnit::GemmFp32 || k.unit == CostUnit::GemmTf32; }

}  // namespace

void bench_model_predict(const ModelBenchOptions& o) {
  const DevicePeak* peak = find_device_peak(o.predict);
  if (!peak) throw Error("bench model --predict: unknown GPU '" + o.predict + "' (a100, h100, h200)");
  const RunConfig run = bench_run_config(o.config, o.precision);
  const DType dt = parse_dtype(o.precision);
  const int64_t B = o.batch, T = o.seq;
  const StepCosts c = record_step_costs(run, dt, B, T);
  const RooflineAssumptions a = roofline_assumptions(*peak, o);
  if (o.ranks > 0 && o.json) return bench_scaling_predict(o, run, *peak, a);  // the data-parallel step only
  auto secs = [&](const std::vector<KernelCost>& ks, auto&& keep) {
    double s = 0;
    for (const auto& k : ks)
      if (keep(k)) s += roofline_seconds(k, *peak, a);
    return s;
  };
  auto all = [](const KernelCost&) { return true; };
  const double step = secs(c.micro_batch, all), update = secs(c.update, all);
  const double gemm = secs(c.micro_batch, [](const KernelCost& k) { return is_gemm(k); });
  const double attention = secs(c.micro_batch, [](const KernelCost& k) { return is_attention(k.name); });
  int64_t launches = 0, update_launches = 0;
  for (const auto& k : c.micro_batch) launches += k.launches;
  for (const auto& k : c.update) update_launches += k.launches;
  const int64_t gemm_params = c.gemm_params;
  const double flops_token = c.flops_per_token;
  const double mfu = flops_token * B * T / step / (peak->bf16_tflops * 1e12);
  std::printf("bench model --predict %s: %s, micro-batch %lld x %lld, %s; a roofline from the kernels' byte and FLOP counts, not a measurement\n",
              peak->name.c_str(), run.model.name.c_str(), (long long)B, (long long)T, o.precision.c_str());
  std::printf("  peaks: %.1f TFLOP/s BF16 dense, %.1f FP32, %.1f TF32, %.0f GB/s; assumed: cuBLASLt GEMMs at %.0f%% of peak, mma.sync attention at %.0f%%,\n"
              "  FP32 FMA kernels at %.0f%%, memory-bound kernels at %.0f%% of the bandwidth\n",
              peak->bf16_tflops, peak->fp32_tflops, peak->tf32_tflops, peak->bandwidth_gbs, 100 * a.gemm, 100 * a.attention, 100 * a.simt, 100 * a.memory);
  if (const std::string w = staged_gemm_widths(run.model, run.precision.params); !w.empty())
    std::printf("  GEMM widths off 16 bytes (%s): %s\n", kStagedGemmWidthsNote, w.c_str());
  std::printf("  one micro-batch, forward and backward:\n");
  print_roofline(c.micro_batch, *peak, a);
  std::printf("  one optimizer update (%s, whole model on one GPU):\n", choice_name(run.optimizer.name).c_str());
  print_roofline(c.update, *peak, a);
  std::printf("  micro-batch %.3f ms: GEMMs %.3f ms, attention %.3f ms = %.1f%% of the GEMM time, every other kernel %.3f ms = %.1f%% of the micro-batch\n",
              step * 1e3, gemm * 1e3, attention * 1e3, gemm > 0 ? 100 * attention / gemm : 0.0, (step - gemm) * 1e3,
              step > 0 ? 100 * (step - gemm) / step : 0.0);
  std::printf("  %.0f tokens/s per GPU, MFU %.1f%% (%.1f MFLOP per token: 6 x %lld GEMM params + 12 x L x T x C; optimizer not included)\n",
              B * T / step, 100 * mfu, flops_token / 1e6, (long long)gemm_params);
  std::printf("  optimizer update %.3f ms (%.1f%% of one micro-batch; divide by the micro-batches an update accumulates)\n", update * 1e3,
              step > 0 ? 100 * update / step : 0.0);
  // The update's statistics stay outside its graph; the rules' launches are one graph (SWAN's too:
  // its decisions are the device's).
  int64_t statistics_launches = 0;
  for (const KernelCost& k : c.update)
    if (k.name == "update_statistics" || k.name.rfind("sum_squares_many", 0) == 0) statistics_launches += k.launches;
  std::printf("  launches: %lld per micro-batch (%.2f-%.2f ms of launch overhead at 3-5 us each: what its CUDA graph replay saves), "
              "%lld per update (%.2f-%.2f ms; a CUDA graph replays all but the statistics' %lld)\n",
              (long long)launches, launches * 3e-3, launches * 5e-3, (long long)update_launches, update_launches * 3e-3, update_launches * 5e-3,
              (long long)statistics_launches);
  // The paper's three matrix rules side by side. SWAN's update as an eager run pays it (every one of
  // its ns_steps), and as the trainer's graph does at most: its device loop ends once every matrix
  // is done, within the scaled iteration's bound (docs/optimizers.md), bodies of two steps.
  std::printf("  optimizer updates, whole model on one GPU:");
  for (const OptimizerKind kind : {OptimizerKind::SinkGD, OptimizerKind::Swan, OptimizerKind::Adam}) {
    RunConfig r = run;
    r.optimizer.name = kind;
    const std::vector<KernelCost> update = record_step_costs(r, dt, B, T).update;
    const double u = secs(update, all);
    int64_t launches_of_update = 0;  // each a few us the roofline does not count (a graph replays them)
    for (const KernelCost& k : update) launches_of_update += k.launches;
    std::string note;
    if (kind == OptimizerKind::Swan) {
      const int64_t eager = (r.optimizer.swan.ns_steps + 1) / 2 * 2, tolerance_steps = optim_math::ns_steps_bound(r.optimizer.swan.ns_tolerance);
      // each step checked at its end: the loop's last body the one whose check finds every matrix done
      const int64_t graphed = r.optimizer.swan.ns_tolerance > 0 ? std::min(eager, std::max<int64_t>(2, (tolerance_steps + 1) / 2 * 2)) : eager;
      char text[160];
      if (graphed == eager) {
        std::snprintf(text, sizeof text, " (%lld Newton-Schulz steps, eagerly and in the trainer's graph)", (long long)eager);
      } else {
        RunConfig g = r;
        g.optimizer.swan.ns_steps = graphed;
        const double ug = secs(record_step_costs(g, dt, B, T).update, all);
        std::snprintf(text, sizeof text, " (%lld Newton-Schulz steps, as run eagerly; in the trainer's graph %lld, the scaled steps' bound: %.3f ms)",
                      (long long)eager, (long long)graphed, ug * 1e3);
      }
      note = text;
    }
    std::printf(" %s %.3f ms in %lld launches%s", choice_name(kind).c_str(), u * 1e3, static_cast<long long>(launches_of_update), note.c_str());
  }
  std::printf("\n");
  if (o.ranks > 0) bench_scaling_predict(o, run, *peak, a);  // what N GPUs add (scaling_model.h)
}

namespace {

// What bench model measures, for its two printers.
struct ModelBench {
  ModelConfig cfg;
  int64_t B = 0, T = 0, gemm_params = 0;
  int threads = 0;
  std::string backend, engine, torch_mode = "not measured";
  bool host_memory = true, split_heads = false;
  int64_t warmup = 0, graph_replays = 0, profile_steps = 1;  // timed steps replayed from a CUDA graph; steps the per-op profile sums
  std::string graphs_gave_up;
  double flops_token = 0, train_s = 0, fwd_s = 0, gemm_gflops = 0, ratio = 0, torch_tps = 0;
  std::vector<double> ratios;
  OpProfile profile;
  struct KernelRow {
    std::string name;
    int64_t launches = 0, predicted_launches = 0;
    double ms = 0, bytes = 0, flops = 0, predicted_s = 0;
  };
  std::vector<KernelRow> kernels;
  const DevicePeak* peak = nullptr;
  double bwd_s() const { return train_s - fwd_s; }
  double train_tps() const { return B * T / train_s; }
  double gflops() const { return flops_token * train_tps() / 1e9; }
};

// Rounds: one training step, then the model's GEMMs on the same backend (each shape once warm, then
// timed once), so each round's ratio compares the two under the same machine conditions. This
// machine's speed drifts by tens of percent between seconds; timed in separate phases, the ratio
// moved between 38% and 97% from one run to the next of one build. The ratio reported is the
// median of the rounds'; the step time and GEMM figure shown are means.
void time_steps_against_gemms(ModelBench& r, Backend& be, LlamaModel& model, const MicroBatch& mb, DType dt, const ModelBenchOptions& o) {
  const int64_t BT = r.B * r.T;
  std::vector<void*> bufs;
  struct GemmOperands {
    Buf a, b, c;
  };
  std::vector<GemmOperands> ops;
  const auto gemms = training_step_gemms(r.cfg, BT);
  double gemm_flops = 0;
  for (const auto& g : gemms) {
    auto alloc = [&](int64_t n, DType t) { bufs.push_back(be.allocate(n * dtype_bytes(t))); return Buf{bufs.back(), t}; };
    ops.push_back({alloc(g.M * g.K, dt), alloc(g.K * g.N, dt), alloc(g.M * g.N, DType::F32)});
    gemm_flops += 2.0 * g.M * g.N * g.K * g.count;
  }
  auto time_gemms = [&] {  // seconds for one step's GEMMs, each shape timed warm
    double s = 0;
    for (size_t k = 0; k < gemms.size(); ++k) {
      const auto& g = gemms[k];
      be.matmul(ops[k].c, ops[k].a, ops[k].b, g.M, g.N, g.K, g.trans_a, g.trans_b, false);  // create the primitive, warm caches
      be.queue().wait_all();  // a device backend's launches are asynchronous: time them to completion
      const auto t = Clock::now();
      be.matmul(ops[k].c, ops[k].a, ops[k].b, g.M, g.N, g.K, g.trans_a, g.trans_b, false);
      be.queue().wait_all();
      s += seconds_since(t) * g.count;
    }
    return s;
  };
  // A device backend's steps are timed as the trainer runs them: replayed from a CUDA graph, with no
  // per-op profiling (that waits for the GPU around every op and runs the step eagerly, launch by
  // launch); its per-op profile is a separate untimed step below. The CPU backend's ops are
  // synchronous, so its timed steps are profiled as they run.
  const bool device = !be.host_memory();
  if (device) model.set_graphs(true);
  const int64_t warmup = device ? std::max<int64_t>(o.warmup, 2) : o.warmup;  // eager, then captured: the timed steps replay
  r.warmup = warmup;
  for (int64_t i = 0; i < warmup; ++i) model.forward_backward(mb, 1.0f / BT);
  const int64_t replays_before = model.graphs().replays();
  model.profile().enabled = !device;
  model.profile().reset();
  double train_total = 0, gemm_total = 0;
  for (int64_t i = 0; i < o.steps; ++i) {
    be.queue().wait_all();
    const auto t = Clock::now();
    model.forward_backward(mb, 1.0f / BT);
    be.queue().wait_all();
    const double step_s = seconds_since(t), gemm_s = time_gemms();
    train_total += step_s, gemm_total += gemm_s;
    r.ratios.push_back((r.flops_token * BT / step_s) / (gemm_flops / gemm_s));
  }
  for (void* p : bufs) be.release(p);
  std::sort(r.ratios.begin(), r.ratios.end());
  const size_t half = r.ratios.size() / 2;
  r.ratio = r.ratios.size() % 2 ? r.ratios[half] : (r.ratios[half - 1] + r.ratios[half]) / 2;
  r.train_s = train_total / o.steps;
  r.gemm_gflops = gemm_flops / (gemm_total / o.steps) / 1e9;
  r.graph_replays = model.graphs().replays() - replays_before;
  r.graphs_gave_up = model.graphs().gave_up();
  if (device) {  // the per-op profile: one more step, eager, each op waited for (not timed above)
    model.profile().enabled = true;
    model.profile().reset();
    model.forward_backward(mb, 1.0f / BT);
    r.profile_steps = 1;
  } else {
    r.profile_steps = o.steps;
  }
  r.profile = model.profile();
  model.profile().enabled = false;
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < o.steps; ++i) model.forward(mb);
  r.fwd_s = seconds_since(t0) / o.steps;
}

// A device backend: one more step with a CUDA event pair around every launch, joined by kernel name
// with the recorded byte and FLOP counts of the same step (kernel_costs.h).
void profile_kernels(ModelBench& r, Backend& be, LlamaModel& model, const MicroBatch& mb, DType dt, const ModelBenchOptions& o) {
  const RooflineAssumptions assume = roofline_assumptions(*find_device_peak(o.peak), o);
  std::map<std::string, KernelCost> costs;
  for (const KernelCost& k : record_step_costs(bench_run_config(o.config, o.precision), dt, r.B, r.T).micro_batch) costs[k.name] = k;
  be.set_profiling(true);
  model.forward_backward(mb, 1.0f / (r.B * r.T));
  const std::vector<KernelTime> measured = be.take_profile();
  be.set_profiling(false);
  for (const KernelTime& t : measured) {
    ModelBench::KernelRow row{t.name, t.launches, 0, t.ms, 0, 0, 0};
    if (auto it = costs.find(t.name); it != costs.end()) {
      row.predicted_launches = it->second.launches;
      row.bytes = it->second.bytes;
      row.flops = it->second.flops;
      row.predicted_s = roofline_seconds(it->second, *r.peak, assume);
    }
    r.kernels.push_back(row);
  }
}

// PyTorch on the same model and batch (bench/torch_llama.py).
void time_torch(ModelBench& r, const ModelBenchOptions& o) {
  if (o.torch == "off") return;
  const std::string script = std::string(MULTINORM_SOURCE_DIR) + "/bench/torch_llama.py";
  // PyTorch's bundled oneDNN is capped below AMX as ours is (its AMX kernels die with SIGILL here).
  const std::string cmd = "ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 /usr/bin/python3 " + script + " --config " + o.config + " --batch " +
                          std::to_string(r.B) + " --seq " + std::to_string(r.T) + " --threads " + std::to_string(r.threads) + " --steps " +
                          std::to_string(o.steps) + " 2>/dev/null";
  const json out = json::parse(run_command(cmd), nullptr, false);
  if (out.is_object() && out.contains("best_tokens_per_s")) {
    r.torch_tps = out["best_tokens_per_s"].get<double>();
    r.torch_mode = out["best_mode"].get<std::string>();
  } else {
    r.torch_mode = "unavailable (python3-torch missing or the script failed)";
  }
}

void print_json(const ModelBench& r, const ModelBenchOptions& o) {
  json j = {{"model", r.cfg.name}, {"gemm_engine", r.engine}, {"batch", r.B}, {"seq", r.T}, {"threads", r.threads}, {"precision", o.precision},
            {"train_tokens_per_s", r.train_tps()}, {"forward_tokens_per_s", r.B * r.T / r.fwd_s}, {"backward_s", r.bwd_s()},
            {"gflops", r.gflops()}, {"gemm_peak_gflops", r.gemm_gflops}, {"ratio_to_gemm_peak", r.ratio},
            {"ratio_to_gemm_peak_rounds", r.ratios}, {"torch_tokens_per_s", r.torch_tps}, {"torch_mode", r.torch_mode},
            {"ratio_to_torch", r.torch_tps > 0 ? r.train_tps() / r.torch_tps : 0.0}};
  if (r.host_memory) j["attention_flops_share"] = cpu::attention_blocked_flops_share(r.T, r.split_heads);
  for (const auto& k : r.kernels)
    j["kernels"].push_back({{"name", k.name}, {"launches", k.launches}, {"ms", k.ms}, {"bytes", k.bytes}, {"flops", k.flops},
                            {"predicted_ms_" + r.peak->name, k.predicted_s * 1e3}});
  if (!r.kernels.empty()) j["mfu_" + r.peak->name] = r.gflops() * 1e9 / (r.peak->bf16_tflops * 1e12);
  if (!r.host_memory) {
    j["timed"] = "CUDA graphs as the trainer runs them, no per-op profiling; profile_s: one more step, eager, each op waited for";
    j["cuda_graph_replays"] = r.graph_replays;  // of the timed steps (o.steps when every one replayed)
    if (!r.graphs_gave_up.empty()) j["cuda_graphs_gave_up"] = r.graphs_gave_up;
  }
  for (size_t i = 0; i < r.profile.seconds.size(); ++i) j["profile_s"][op_name(static_cast<Op>(i))] = r.profile.seconds[i] / r.profile_steps;
  std::printf("%s\n", j.dump(2).c_str());
}

void print_kernels(const ModelBench& r) {
  std::printf("  per kernel (CUDA events, one step; bytes and FLOPs from the kernels' counts; predicted: the %s roofline):\n", r.peak->name.c_str());
  std::printf("    %-30s %8s %10s %9s %9s %12s %8s\n", "kernel", "launches", "time us", "GB/s", "TFLOP/s", "predicted us", "ratio");
  double total_ms = 0;
  for (const auto& k : r.kernels) total_ms += k.ms;
  for (const auto& k : r.kernels) {
    const double s = k.ms / 1e3;
    std::printf("    %-30s %8lld %10.1f %9.1f %9.2f %12.1f %8.2f%s\n", k.name.c_str(), (long long)k.launches, k.ms * 1e3, s > 0 ? k.bytes / s / 1e9 : 0.0,
                s > 0 ? k.flops / s / 1e12 : 0.0, k.predicted_s * 1e6, k.predicted_s > 0 ? s / k.predicted_s : 0.0,
                k.predicted_launches != k.launches ? "  (launch count differs from the cost model's)" : "");
  }
  std::printf("    kernels %.3f ms of a %.3f ms step; MFU %.1f%% of the %s's %.0f TFLOP/s BF16\n", total_ms, r.train_s * 1e3,
              100.0 * r.gflops() * 1e9 / (r.peak->bf16_tflops * 1e12), r.peak->name.c_str(), r.peak->bf16_tflops);
}

void print_text(const ModelBench& r, const ModelBenchOptions& o) {
  std::printf("bench model: %s, micro-batch %lld x %lld, %s, backend %s, %d threads, %lld steps after %lld warm-up\n", r.cfg.name.c_str(),
              (long long)r.B, (long long)r.T, o.precision.c_str(), r.backend.c_str(), r.threads, (long long)o.steps, (long long)r.warmup);
  std::printf("  %.1f MFLOP per token (6 x %lld GEMM params + 12 x L x T x C)\n", r.flops_token / 1e6, (long long)r.gemm_params);
  if (const std::string w = staged_gemm_widths(r.cfg, parse_dtype(o.precision)); !w.empty() && r.backend.rfind("cuda", 0) == 0)
    std::printf("  GEMM widths off 16 bytes (%s): %s\n", kStagedGemmWidthsNote, w.c_str());
  std::printf("  forward            %9.3f s   %10.0f tokens/s\n", r.fwd_s, r.B * r.T / r.fwd_s);
  std::printf("  backward           %9.3f s\n", r.bwd_s());
  std::printf("  train step         %9.3f s   %10.0f tokens/s   %7.1f GFLOP/s\n", r.train_s, r.train_tps(), r.gflops());
  std::printf("  %s GEMM (%s) on the model's shapes: %.1f GFLOP/s -> model reaches %.0f%% of it\n"
              "    (the median of %zu interleaved rounds' ratios, which ran %.0f%% to %.0f%%; step and GEMM figures are means)\n",
              o.precision.c_str(), r.engine.c_str(), r.gemm_gflops, 100.0 * r.ratio, r.ratios.size(), 100.0 * r.ratios.front(),
              100.0 * r.ratios.back());
  if (r.torch_tps > 0)
    std::printf("  PyTorch CPU (%s): %.0f tokens/s -> multinorm is %.2fx PyTorch\n", r.torch_mode.c_str(), r.torch_tps, r.train_tps() / r.torch_tps);
  else
    std::printf("  PyTorch CPU: %s\n", r.torch_mode.c_str());
  if (r.host_memory) {  // the CPU attention's blocks (kernels/cpu/attention.cpp)
    const double n = static_cast<double>((r.T + 31) / 32), causal = (n + 1) / (2 * n);
    std::printf("  attention computes %.0f%% of the 12 x L x T x C counted above: blocks up to the diagonal skip %.0f%%,\n"
                "    recomputing S in the backward adds %.0f%%%s\n",
                100.0 * cpu::attention_blocked_flops_share(r.T, r.split_heads), 100.0 * (1 - causal), 100.0 * (r.split_heads ? 3 : 1) * causal / 6,
                r.split_heads ? " (heads split over threads: S and dP again in a query pass)" : "");
  }
  if (!r.kernels.empty()) print_kernels(r);
  if (!r.host_memory)
    std::printf("  train step timed replaying CUDA graphs (%lld of %lld steps replayed%s%s); the ops below: one more step, eager, each op waited for\n",
                (long long)r.graph_replays, (long long)o.steps, r.graphs_gave_up.empty() ? "" : "; graphs gave up: ", r.graphs_gave_up.c_str());
  std::printf("  where a training step's time goes:\n");
  double total = 0;
  for (double s : r.profile.seconds) total += s;
  for (size_t i = 0; i < r.profile.seconds.size(); ++i)
    std::printf("    %-14s %8.4f s  %5.1f%%\n", op_name(static_cast<Op>(i)), r.profile.seconds[i] / r.profile_steps, 100.0 * r.profile.seconds[i] / total);
}

}  // namespace

void bench_model(const ModelBenchOptions& o) {
  const json doc = read_json_file(o.config);
  ModelBench r;
  r.cfg = is_model_config(doc) ? load_model_config(o.config) : load_run_config(o.config).model;
  const DType dt = parse_dtype(o.precision);
  auto be = make_backend(choose_backend(o.backend), o.threads);
  r.B = o.batch, r.T = o.seq, r.threads = be->threads(), r.backend = be->name(), r.host_memory = be->host_memory();
  r.peak = find_device_peak(o.peak);
  LlamaModel model(*be, r.cfg, dt, r.B, r.T);
  model.init_random(0);
  std::mt19937 gen(1);
  std::vector<int32_t> tokens(r.B * r.T), targets(r.B * r.T);
  for (auto& t : tokens) t = static_cast<int32_t>(gen() % r.cfg.vocab_size);
  for (size_t i = 0; i < tokens.size(); ++i) targets[i] = tokens[(i + 1) % tokens.size()];
  const MicroBatch mb{tokens.data(), targets.data(), nullptr, r.B, r.T};
  r.flops_token = model_flops_per_token(model, r.T, &r.gemm_params);
  time_steps_against_gemms(r, *be, model, mb, dt, o);
  if (!be->host_memory()) profile_kernels(r, *be, model, mb, dt, o);
  time_torch(r, o);
  // The CPU attention's heads are whole (one thread each) or split over threads (attention.cpp).
  r.split_heads = cpu::attention_splits_per_head(r.B * r.cfg.num_attention_heads, r.T, be->threads()) > 1;
  // What the GEMM figure was measured on: the backend's own GEMM path.
  r.engine = !be->host_memory() ? "cuBLASLt" : o.precision == "bf16" ? cpu_bf16_gemm_engine() : "oneDNN";
  if (o.json) print_json(r, o);
  else print_text(r, o);
}

}  // namespace multinorm
