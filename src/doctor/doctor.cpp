// `multinorm doctor` (include/multinorm/doctor.h): the environment, the checks of
// doctor_checks.cpp, the timed step, the printed summary and the JSON report.
#include "multinorm/doctor.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>

#include "doctor_checks.h"
#include "multinorm/data_parallel.h"
#include "multinorm/device.h"
#include "multinorm/divergence.h"
#include "multinorm/error.h"
#include "multinorm/json_file.h"
#include "multinorm/kernel_costs.h"
#include "multinorm/llama_model.h"
#include "multinorm/memory_estimate.h"
#include "multinorm/optimizer.h"
#include "multinorm/run_config.h"
#include "multinorm/update_pipeline.h"

namespace multinorm {

double bf16_dense_peak_tflops(const std::string& name) {
  // Datasheet BF16 tensor-core throughput without sparsity, by the name the driver reports.
  struct Peak {
    const char* match;
    double tflops;
  };
  static const Peak peaks[] = {
      {"GH200", 989.4}, {"H200", 989.4},     {"H100 PCIe", 756.0}, {"H100 NVL", 835.0}, {"H100", 989.4}, {"H800 PCIe", 756.0},
      {"H800", 989.4},  {"A100", 312.0},     {"A800", 312.0},      {"B200", 2250.0},    {"B100", 1750.0}, {"L40S", 362.1},
      {"L40", 181.0},   {"A10G", 70.0},      {"A10", 125.0},       {"A30", 165.0},      {"L4", 121.0},
  };
  for (const Peak& p : peaks)
    if (name.find(p.match) != std::string::npos) return p.tflops;
  return 0;
}

namespace {

using Clock = std::chrono::steady_clock;

// The cost model's GPU (kernel_costs.h) for the name the driver reports: the SXM parts it has peaks
// for; a PCIe or NVL H100/H800 has other peaks, so no prediction.
const char* roofline_gpu(const std::string& name) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (has("H200")) return "h200";
  if ((has("H100") || has("H800")) && !has("PCIe") && !has("NVL")) return "h100";
  if (has("A100") || has("A800")) return "a100";
  return "";
}


// The run config of the timed step: the paper's recipe (SinkGD on the matrices, Adam elsewhere,
// BF16), this micro-batch, one update per micro-batch.
RunConfig step_run(const ModelConfig& m, int64_t B, int64_t T) { return doctor_run(m, "sinkgd", "bf16", B, T); }

// The largest configs/models/*.json whose training step (the CUDA backend's device-memory plan) fits
// the GPU's free memory.
std::string largest_fitting(const DoctorOptions& o, size_t free_bytes) {
  std::string best;
  int64_t best_params = 0;
  for (const char* name : {"llama_tiny", "llama_20m", "llama_60m", "llama_130m", "llama_350m", "llama_1b", "llama_7b"}) {
    try {
      const ModelConfig m = load_model_config(model_config_path(name));
      const RunConfig run = step_run(m, std::max(o.batch, o.step_batch), std::min(o.seq, m.max_position_embeddings));
      const TrainingMemory mem = training_memory(run, true);
      // Keep a tenth for the CUDA context, cuBLASLt's plans and fragmentation.
      if (static_cast<double>(mem.total()) > 0.9 * static_cast<double>(free_bytes)) continue;
      int64_t params = m.vocab_size * m.hidden_size * (m.tie_word_embeddings ? 1 : 2) +
                       m.num_hidden_layers * (4 * m.hidden_size * m.hidden_size + 3 * m.hidden_size * m.intermediate_size);
      if (params > best_params) best = name, best_params = params;
    } catch (const Error&) {
    }
  }
  return best;
}

// Training steps timed two ways: every launch issued by the host and each update waited for as soon
// as it is queued (cuda_graphs false, Optimizer::step), and as the trainer runs them: the micro-batch
// and the update replayed from CUDA graphs, each update's statistics read after the next update's
// micro-batch is queued. Then one more step profiled: per-kernel device times beside the cost
// model's roofline for this GPU (kernel_costs.h) when it is an A100 or H100.
// TFLOP/s of one BF16 GEMM [n, n] x [n, n] on `be`: the best of three after a warm-up.
double square_gemm_tflops(Backend& be, int64_t n) {
  Buf a{be.allocate(n * n * 2), DType::BF16}, b{be.allocate(n * n * 2), DType::BF16}, c{be.allocate(n * n * 2), DType::BF16};
  be.matmul(c, a, b, n, n, n, false, true, false);
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    be.queue().wait_all();
    const auto t0 = Clock::now();
    be.matmul(c, a, b, n, n, n, false, true, false);
    be.queue().wait_all();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  for (const Buf& x : {a, b, c}) be.release(x.ptr);
  return 2.0 * n * n * n / best / 1e12;
}

json graph_counts_json(const GraphCounts& g) {
  return {{"micro_batch_captures", g.micro_batch_captures}, {"micro_batch_replays", g.micro_batch_replays}, {"update_captures", g.update_captures},
          {"update_replays", g.update_replays}};
}

// The profiled step's kernels beside the cost model's roofline for this GPU (where it has one), and
// the model's GEMMs against the device's own square GEMM (a warning under 70% of it).
void add_kernel_report(json& j, const RunConfig& run, const ModelConfig& cfg, int64_t B, int64_t T, const std::vector<KernelTime>& kernels,
                       const std::string& name, double reference_tflops, int64_t gn, bool emulated) {
  // The cost model's roofline of the same step on this GPU, kernel by kernel.
  const DevicePeak* roof = find_device_peak(roofline_gpu(name));
  std::map<std::string, KernelCost> costs;  // the profiled step: a micro-batch and an update
  const StepCosts all_costs = record_step_costs(run, DType::BF16, B, T);
  if (roof) {
    const StepCosts& c = all_costs;
    for (const std::vector<KernelCost>* part : {&c.micro_batch, &c.update})
      for (const KernelCost& k : *part) {
        KernelCost& sum = costs.emplace(k.name, KernelCost{k.name, k.unit, 0, 0, 0}).first->second;
        sum.launches += k.launches, sum.bytes += k.bytes, sum.flops += k.flops;
      }
    j["predicted_on"] = roof->name;
  }
  // The model's GEMMs: their FLOPs from the cost recorder, their time from the profile.
  double gemm_flops = 0, gemm_ms = 0;
  for (const std::vector<KernelCost>* part : {&all_costs.micro_batch, &all_costs.update})
    for (const KernelCost& k : *part)
      if (k.name.rfind("gemm ", 0) == 0) gemm_flops += k.flops;
  for (const KernelTime& k : kernels)
    if (k.name.rfind("gemm ", 0) == 0) gemm_ms += k.ms;
  const double gemm_tflops = gemm_ms > 0 ? gemm_flops / (gemm_ms * 1e-3) / 1e12 : 0;
  j["gemm_reference"] = {{"shape", gn}, {"tflops", reference_tflops}};
  j["model_gemm_tflops"] = gemm_tflops;
  j["model_gemm_fraction"] = reference_tflops > 0 ? gemm_tflops / reference_tflops : 0.0;
  const std::string staged = staged_gemm_widths(cfg, DType::BF16);
  if (!staged.empty()) j["staged_gemm_widths"] = staged;
  if (!emulated && reference_tflops > 0 && gemm_tflops < 0.7 * reference_tflops)
    j["warnings"].push_back("the model's GEMMs ran at " + std::to_string(static_cast<int>(gemm_tflops)) + " TFLOP/s, " +
                            std::to_string(static_cast<int>(100 * gemm_tflops / reference_tflops)) + "% of this GPU's " +
                            std::to_string(gn) + "^3 GEMM (" + std::to_string(static_cast<int>(reference_tflops)) +
                            " TFLOP/s): some shape runs a slow cuBLASLt kernel" + (staged.empty() ? "" : " (widths off 16 bytes: " + staged + ")"));
  double kernel_ms = 0;
  for (const KernelTime& k : kernels) kernel_ms += k.ms;
  json table = json::array();
  for (const KernelTime& k : kernels) {
    json row = {{"name", k.name}, {"launches", k.launches}, {"ms", k.ms}, {"share", kernel_ms > 0 ? k.ms / kernel_ms : 0.0}};
    if (auto it = costs.find(k.name); it != costs.end()) {
      row["bytes"] = it->second.bytes, row["flops"] = it->second.flops;
      row["predicted_ms"] = roofline_seconds(it->second, *roof, roof->assume) * 1e3;
    }
    table.push_back(row);
  }
  j["kernels"] = table;
}

json timed_step(Backend& gpu, const ModelConfig& cfg, const DoctorOptions& o, const json& device, bool emulated) {
  const int64_t B = o.step_batch > 0 ? o.step_batch : o.batch, T = std::min(o.seq, cfg.max_position_embeddings), BT = B * T;
  const RunConfig run = step_run(cfg, B, T);
  // The trainer's own update pipeline (update_pipeline.h) on one rank: its gradient scales, gradient
  // sync (an identity on one rank), optimizer and spike test.
  Comm& comm = Comm::world();
  LlamaModel model(gpu, cfg, DType::BF16, B, T);
  model.init_random(3);
  Optimizer opt(model.store(), run);
  opt.set_graphs(false);
  const std::unique_ptr<Communicator> grad_comm = make_gradient_communicator(gpu, comm);
  GradientSync sync(model.store(), *grad_comm, ShardPlan{}, static_cast<int64_t>(run.parallel.bucket_mb * 1048576.0), run.parallel.overlap,
                    run.parallel.staging_buckets);
  UpdatePipeline pipeline(model, opt, sync, comm, run.batch.loss_normalization, /*accum=*/1);
  DivergenceMonitor monitor(run.divergence, std::log(static_cast<double>(cfg.vocab_size)));
  std::vector<int32_t> tokens(BT), targets(BT);
  for (int64_t i = 0; i < BT; ++i) tokens[i] = static_cast<int32_t>((i * 7919 + 13) % cfg.vocab_size), targets[i] = tokens[(i + 1) % BT];
  const std::vector<MicroBatch> batches{{tokens.data(), targets.data(), nullptr, B, T}};
  int64_t update = 0;
  UpdateTimes times;
  bool pending = false;  // a queued update whose statistics are not read yet
  auto settle = [&] {
    if (pending) monitor.judge(pipeline.wait_for_step(), 0);
    pending = false;
  };
  auto queue_step = [&] {
    ++update;
    pipeline.queue_step(update, update, monitor.spike_test(), &times);
    pending = true;
  };
  auto step = [&] {  // the update waited for at once: one wait, a drain
    pipeline.queue_micro_batches(batches, BT, &times);
    queue_step();
    settle();
  };
  auto pipelined_step = [&] {  // as the trainer: the previous update's statistics read behind this micro-batch (one wait, no drain)
    pipeline.queue_micro_batches(batches, BT, &times);
    settle();
    queue_step();
  };
  struct Timing {
    double seconds;
    int64_t waits, drains;  // per step
    GraphCounts graphs;     // captured and replayed within the timed steps
  };
  WorkQueue& q = gpu.queue();
  auto graph_counts = [&] { return GraphCounts{model.graphs().captures(), model.graphs().replays(), opt.graphs().captures(), opt.graphs().replays()}; };
  struct Mark {
    Clock::time_point t;
    QueueCounters queue;
    GraphCounts graphs;
  };
  auto mark = [&] { return Mark{Clock::now(), q.counters(), graph_counts()}; };
  const int64_t n = std::max(1, o.steps);
  auto between = [&](const Mark& a, const Mark& b) {
    return Timing{std::chrono::duration<double>(b.t - a.t).count() / n, (b.queue.host_waits - a.queue.host_waits) / n,
                  (b.queue.host_drains - a.queue.host_drains) / n, b.graphs - a.graphs};
  };
  auto timed = [&](const std::function<void()>& one) {  // steps that each end with the device idle
    settle();
    q.wait_all();
    const Mark a = mark();
    for (int64_t s = 0; s < n; ++s) one();
    return between(a, mark());
  };
  // The trainer's steady state: from the moment update k is read (its device work done, step k+1's
  // micro-batch queued behind it) to the moment update k+n is: n steps of device work, the host's
  // launches overlapping it as in a run. A clock started with a step's work still queued would count
  // that work too (a third more at 3 steps).
  auto timed_pipelined = [&] {
    auto queue_micro_batch_and_settle = [&] {
      pipeline.queue_micro_batches(batches, BT, &times);
      settle();
    };
    queue_micro_batch_and_settle();
    const Mark a = mark();
    for (int64_t s = 0; s < n; ++s) queue_step(), queue_micro_batch_and_settle();
    const Mark b = mark();
    queue_step();
    settle();
    q.wait_all();
    return between(a, b);
  };
  model.set_graphs(false);
  for (int w = 0; w < o.warmup; ++w) step();
  const Timing eager = timed(step);
  model.set_graphs(true);
  opt.set_graphs(true);
  pipelined_step(), pipelined_step(), pipelined_step();  // eager, then captured
  const Timing graphed = timed_pipelined();
  // The graphs once more with each update waited for at once, as the eager steps: a graphed step
  // slower than an eager one is then the replays' (or a capture's: counted) or the pipeline's.
  const Timing graphed_waited = timed(step);
  const double seconds = graphed.seconds, eager_seconds = eager.seconds;
  gpu.set_profiling(true);  // profiled steps run eagerly
  step();
  const std::vector<KernelTime> kernels = gpu.take_profile();
  gpu.set_profiling(false);

  // The device's own best BF16 GEMM (8192^3; 128^3 on the emulation), against which the model's
  // GEMMs of the profiled step are measured: below 70% of it says a shape runs a slow kernel.
  const int64_t gn = emulated ? 128 : 8192;
  const double reference_tflops = square_gemm_tflops(gpu, gn);
  const double flops = model_flops_per_token(model, T) * BT;
  const std::string name = device.value("name", std::string());
  const double peak = bf16_dense_peak_tflops(name), tflops = flops / seconds / 1e12;
  double kernel_ms = 0;
  int64_t launches = 0;
  for (const KernelTime& k : kernels) kernel_ms += k.ms, launches += k.launches;
  json j = {{"model", cfg.name}, {"batch", B}, {"seq", T}, {"optimizer", "sinkgd (matrices) + adam"}, {"step_seconds", seconds},
            {"step_seconds_eager", eager_seconds}, {"graph_speedup", eager_seconds / seconds}, {"launches_per_step", launches},
            {"host_waits_per_step", graphed.waits}, {"host_drains_per_step", graphed.drains}, {"host_waits_per_step_eager", eager.waits},
            {"host_drains_per_step_eager", eager.drains}, {"tokens_per_s", BT / seconds}, {"tflops", tflops}, {"flops_per_step", flops},
            {"kernel_ms", kernel_ms}};
  j["step_seconds_graphs_waited"] = graphed_waited.seconds;
  j["graphs_in_timed_steps"] = graph_counts_json(graphed.graphs);
  if (!emulated && eager_seconds < 0.95 * seconds)  // the trainer's way, the graphs, ran slower than every launch from the host
    j["warnings"].push_back(graphs_slower_warning(eager_seconds, seconds, graphed_waited.seconds, graphed.graphs, o.steps));
  if (peak > 0) j["peak_tflops"] = peak, j["mfu"] = tflops / peak;
  else j["mfu_note"] = "no BF16 peak known for '" + name + "': MFU not computed";
  add_kernel_report(j, run, cfg, B, T, kernels, name, reference_tflops, gn, emulated);
  return j;
}

void print_step(const json& s, bool emulated) {
  std::printf("\ntimed step: %s, %lld x %lld tokens, %s\n", s["model"].get<std::string>().c_str(), static_cast<long long>(s["batch"].get<int64_t>()),
              static_cast<long long>(s["seq"].get<int64_t>()), s["optimizer"].get<std::string>().c_str());
  std::printf("  %.4f s a step, %.0f tokens/s, %.2f TFLOP/s", s["step_seconds"].get<double>(), s["tokens_per_s"].get<double>(),
              s["tflops"].get<double>());
  if (s.contains("mfu")) std::printf(", MFU %.1f%% of %.0f TFLOP/s (BF16 dense)\n", 100 * s["mfu"].get<double>(), s["peak_tflops"].get<double>());
  else std::printf(" (%s)\n", s["mfu_note"].get<std::string>().c_str());
  std::printf("  eager (every launch from the host, each update waited for at once): %.4f s a step, %lld host wait(s) and %lld drain(s);\n"
              "  as the trainer runs (graphs, the statistics read a step later): %.2fx that speed, %lld host wait(s) and %lld drain(s) a step\n",
              s["step_seconds_eager"].get<double>(), static_cast<long long>(s["host_waits_per_step_eager"].get<int64_t>()),
              static_cast<long long>(s["host_drains_per_step_eager"].get<int64_t>()), s["graph_speedup"].get<double>(),
              static_cast<long long>(s["host_waits_per_step"].get<int64_t>()), static_cast<long long>(s["host_drains_per_step"].get<int64_t>()));
  const json& g = s["graphs_in_timed_steps"];
  std::printf("  graphs with each update waited for at once: %.2fx the eager speed; the timed steps replayed %lld micro-batch and %lld update graph(s),\n"
              "  captured %lld and %lld\n",
              s["step_seconds_eager"].get<double>() / s["step_seconds_graphs_waited"].get<double>(),
              static_cast<long long>(g["micro_batch_replays"].get<int64_t>()), static_cast<long long>(g["update_replays"].get<int64_t>()),
              static_cast<long long>(g["micro_batch_captures"].get<int64_t>()), static_cast<long long>(g["update_captures"].get<int64_t>()));
  std::printf("  %lld kernel launches a step (one micro-batch and its update)\n", static_cast<long long>(s["launches_per_step"].get<int64_t>()));
  std::printf("  the model's GEMMs: %.1f TFLOP/s, %.0f%% of this device's %lld^3 BF16 GEMM (%.1f TFLOP/s)\n", s["model_gemm_tflops"].get<double>(),
              100 * s["model_gemm_fraction"].get<double>(), static_cast<long long>(s["gemm_reference"]["shape"].get<int64_t>()),
              s["gemm_reference"]["tflops"].get<double>());
  if (s.contains("staged_gemm_widths"))
    std::printf("  GEMM widths off 16 bytes (%s): %s\n", kStagedGemmWidthsNote, s["staged_gemm_widths"].get<std::string>().c_str());
  for (const auto& w : s.value("warnings", json::array())) std::printf("  warning: %s\n", w.get<std::string>().c_str());
  if (emulated) std::printf("  (the emulated plugin: these are the CPU emulation's times, not a GPU's)\n");
  const bool predicted = s.contains("predicted_on");
  std::printf("  %-36s %8s %10s %6s%s\n", "kernel (slowest first)", "launches", "ms", "share",
              predicted ? ("   predicted ms (" + s["predicted_on"].get<std::string>() + " roofline)").c_str() : "");
  int shown = 0;
  for (const auto& k : s["kernels"]) {
    if (++shown > 12) break;
    std::printf("  %-36s %8lld %10.3f %5.1f%%", k["name"].get<std::string>().c_str(), static_cast<long long>(k["launches"].get<int64_t>()),
                k["ms"].get<double>(), 100 * k["share"].get<double>());
    if (k.contains("predicted_ms")) std::printf("   %10.3f", k["predicted_ms"].get<double>());
    std::printf("\n");
  }
}

}  // namespace

std::string graphs_slower_warning(double eager_s, double graphed_s, double graphed_waited_s, const GraphCounts& g, int steps) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "the graphed steps (the trainer's way) ran at %.2fx the eager steps' speed, %.2fx with each update waited for at once; "
                "in %d timed steps %lld micro-batch and %lld update graph(s) replayed, %lld and %lld captured%s",
                eager_s / graphed_s, eager_s / graphed_waited_s, steps, static_cast<long long>(g.micro_batch_replays),
                static_cast<long long>(g.update_replays), static_cast<long long>(g.micro_batch_captures), static_cast<long long>(g.update_captures),
                g.micro_batch_captures + g.update_captures > 0 ? " (a capture in a timed step: a buffer moved under a graph)"
                : eager_s < 0.95 * graphed_waited_s      ? " (the replays themselves are slower)"
                                                         : " (the pipeline, not the replays: the statistics read a step later)");
  return buf;
}

int run_doctor(const DoctorOptions& o) {
  json report = {{"multinorm", MULTINORM_VERSION}};
  bool ok = true;
  const CudaProbe& probe = probe_cuda();

  // ---- environment ----
  json env = {{"plugin", {{"path", probe.plugin_path}, {"loaded", probe.plugin_loaded}, {"emulated", probe.emulated}}}};
  if (!probe.load_error.empty()) env["plugin"]["error"] = probe.load_error;
  json libs = json::array();
  for (const CudaLibrary& l : probe.libraries.libraries)
    libs.push_back({{"soname", l.soname}, {"path", l.path}, {"found_by", l.found_by}, {"other_versions", l.other_versions}});
  env["cuda_libraries"] = libs;
  env["cuda_library_dirs_searched"] = probe.libraries.searched;
  env["auto_backend"] = choose_backend("auto").reason;
  json device0;
  if (probe.plugin_loaded && probe.environment) {
    std::vector<char> buf(1 << 16);
    if (probe.environment(buf.data(), buf.size()) == 0) {
      const json e = json::parse(buf.data());
      for (auto it = e.begin(); it != e.end(); ++it) env[it.key()] = it.value();
      if (!e["devices"].empty()) device0 = e["devices"][0];
    }
  }
  report["environment"] = env;
  std::printf("multinorm doctor %s\n", MULTINORM_VERSION);
  std::printf("plugin: %s\n", probe.plugin_loaded ? (probe.plugin_path + (probe.emulated ? " (EMULATED on the CPU: a test instrument)" : "")).c_str()
                                                   : ("not loaded: " + probe.load_error).c_str());
  for (const CudaLibrary& l : probe.libraries.libraries)
    std::printf("  %-20s %s\n", l.soname.c_str(), l.path.empty() ? ("NOT FOUND; " + l.other_versions).c_str() : l.path.c_str());
  if (env.contains("driver_version"))
    std::printf("driver: CUDA %d.%d, runtime %d.%d, cuBLASLt %s, NCCL %s\n", env["driver_version"].get<int>() / 1000,
                env["driver_version"].get<int>() % 1000 / 10, env["runtime_version"].get<int>() / 1000, env["runtime_version"].get<int>() % 1000 / 10,
                env["cublaslt"]["version"].dump().c_str(), env["nccl"].is_null() ? "none" : env["nccl"]["version"].dump().c_str());
  if (env.contains("devices"))
    for (const auto& d : env["devices"])
      std::printf("GPU %d: %s, sm_%s, %d SMs, %.1f GiB (%.1f free), ECC %s, %d MHz, %.0f GB/s peak\n", d["index"].get<int>(),
                  d["name"].get<std::string>().c_str(), d["cc"].get<std::string>().c_str(), d["sms"].get<int>(),
                  d["memory_bytes"].get<double>() / 1073741824.0, d["free_bytes"].get<double>() / 1073741824.0, d["ecc"].get<int>() == 1 ? "on" : "off",
                  d["sm_clock_mhz"].get<int>(), d["peak_bandwidth_gbs"].get<double>());
  std::printf("backend auto -> %s\n", env["auto_backend"].get<std::string>().c_str());

  if (!probe.plugin_loaded || probe.device_count == 0) {
    const std::string why = !probe.plugin_loaded ? "the CUDA plugin did not load: " + probe.load_error : "no usable GPU: " + probe.device_error;
    report["ok"] = false;
    report["error"] = why;
    write_text_file_atomic(o.report, report.dump(2) + "\n");
    std::printf("\nFAIL: %s\nreport: %s\n", why.c_str(), o.report.c_str());
    return 1;
  }

  // ---- the checks, per model ----
  auto cpu = make_cpu_backend(o.threads);
  auto gpu = make_cuda_backend(probe, 0);
  std::vector<std::string> models;
  for (const std::string& m : o.models) {
    if (m != "largest") {
      models.push_back(m);
      continue;
    }
    const std::string l = largest_fitting(o, device0.value("free_bytes", size_t(0)));
    if (l.empty()) std::printf("largest: no model config fits the GPU's free memory\n");
    else models.push_back(l);
  }
  json checks = json::array(), steps = json::array();
  for (const std::string& name : models) {
    const ModelConfig cfg = load_model_config(model_config_path(name));
    std::printf("\n== %s (C %lld, F %lld, %lld heads of %lld, vocabulary %lld), micro-batch %lld x %lld\n", cfg.name.c_str(),
                static_cast<long long>(cfg.hidden_size), static_cast<long long>(cfg.intermediate_size),
                static_cast<long long>(cfg.num_attention_heads), static_cast<long long>(cfg.head_dim()), static_cast<long long>(cfg.vocab_size),
                static_cast<long long>(o.batch), static_cast<long long>(std::min(o.seq, cfg.max_position_embeddings)));
    DoctorChecks dc(*cpu, *gpu, cfg, o.batch, std::min(o.seq, cfg.max_position_embeddings));
    dc.run_all(o.only);
    for (const DoctorCheck& c : dc.results()) {
      ok = ok && c.ok;
      json jc = {{"model", cfg.name}, {"section", c.section}, {"name", c.name}, {"dtype", c.dtype}, {"shape", c.shape}, {"ok", c.ok},
                 {"error", c.error}, {"bound", c.bound}, {"kernels", c.kernels}};
      if (!c.failure.empty()) jc["failure"] = c.failure;
      json outs = json::array();
      for (const auto& out : c.outputs) outs.push_back({{"label", out.label}, {"error", out.error}, {"bound", out.bound}});
      jc["outputs"] = outs;
      checks.push_back(jc);
    }
    if (o.bench) {
      try {
        json s = timed_step(*gpu, cfg, o, device0, probe.emulated);
        print_step(s, probe.emulated);
        steps.push_back(s);
      } catch (const Error& e) {
        std::printf("\ntimed step at %s: not run (%s)\n", cfg.name.c_str(), e.what());
        steps.push_back({{"model", cfg.name}, {"error", e.what()}});
      }
    }
  }
  report["checks"] = checks;
  report["steps"] = steps;

  // ---- NCCL across this node's GPUs ----
  if (probe.device_count > 1 && probe.nccl_selftest) {
    std::vector<char> buf(1 << 16);
    const int rc = probe.nccl_selftest(probe.device_count, size_t(256) << 20, buf.data(), buf.size());
    json n = json::parse(buf.data(), nullptr, false);
    report["nccl"] = n;
    std::printf("\nNCCL across %d GPUs: %s\n", probe.device_count, rc == 0 ? "PASS" : "FAIL");
    if (n.contains("collectives"))
      for (const auto& c : n["collectives"])
        std::printf("  %-16s %s, %.1f GB/s bus bandwidth (%.0f MB)\n", c["name"].get<std::string>().c_str(),
                    c["wrong_elements"].get<long long>() == 0 ? "exact" : "WRONG", c["bus_bandwidth_gbs"].get<double>(), c["bytes"].get<double>() / 1e6);
    if (n.contains("error")) std::printf("  %s\n", n["error"].get<std::string>().c_str());
    ok = ok && rc == 0;
  } else {
    report["nccl"] = {{"skipped", std::to_string(probe.device_count) + " GPU visible"}};
  }

  int failed = 0;
  for (const auto& c : report["checks"]) failed += !c["ok"].get<bool>();
  report["ok"] = ok;
  write_text_file_atomic(o.report, report.dump(2) + "\n");
  std::printf("\n%s: %d of %zu checks passed%s; report: %s\n", ok ? "PASS" : "FAIL", static_cast<int>(report["checks"].size()) - failed,
              report["checks"].size(), report["nccl"].contains("gpus") ? " (and NCCL)" : "", o.report.c_str());
  return ok ? 0 : 1;
}

}  // namespace multinorm
