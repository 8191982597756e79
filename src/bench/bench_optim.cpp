// `multinorm bench optim`: one optimizer step over a model's tensors, per optimizer, against Adam and
// against a memory-copy bandwidth measured in the same run (SinkGD is memory-bound).
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>

#include "multinorm/device.h"
#include "multinorm/bench.h"
#include "multinorm/json_file.h"
#include "multinorm/kernel_costs.h"
#include "multinorm/llama_model.h"
#include "multinorm/optimizer.h"

namespace multinorm {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Wall time of one fn(), timed to completion on the backend (a device backend's launches are
// asynchronous); the rounds below keep the best.
template <class Fn>
double timed(Backend& be, Fn&& fn) {
  be.queue().wait_all();
  const auto t = Clock::now();
  fn();
  be.queue().wait_all();
  return since(t);
}
// The model's gradient arena from N(0, 1e-3): a block of 4M draws, repeated (drawing all 1.34e9 of
// llama_1b's on one host thread took most of a minute before the first timing).
void fill_gradients(Backend& be, LlamaModel& model) {
  const int64_t n = model.store().arena_elements(), block = std::min<int64_t>(n, int64_t{1} << 22);
  std::vector<float> g(block);
  std::mt19937 gen(1);
  std::normal_distribution<float> d(0.0f, 1e-3f);
  for (auto& x : g) x = d(gen);
  void* staging = be.allocate(block * 4);
  be.to_device(staging, g.data(), block * 4);
  for (int64_t at = 0; at < n; at += block) be.convert(model.grads().at(at), Buf{staging, DType::F32}, std::min(block, n - at));
  for (const TensorSpec& t : model.tensors()) {  // a padded tensor's padding back to zeros (the arena's)
    for (int64_t r = 0; t.arena_ld && r < t.rows(); ++r) be.zero(model.grads().at(t.arena_offset + r * t.arena_ld + t.cols()), t.arena_ld - t.cols());
    if (t.arena_rows > t.rows()) be.zero(model.grads().at(t.arena_offset + t.rows() * t.row_stride()), (t.arena_rows - t.rows()) * t.row_stride());
  }
  be.queue().wait_all();
  be.release(staging);
}

// Memory bandwidth: a copy of 256 MiB (read + write counted) in the backend's memory: host memcpy on
// threads for the CPU, a device-to-device copy kernel (convert fp32 -> fp32) otherwise.
class BandwidthCopy {
 public:
  static constexpr int64_t kBytes = int64_t{256} << 20;
  explicit BandwidthCopy(Backend& be) : be_(be) {
    if (be_.host_memory()) host_a_.assign(kBytes, 1), host_b_.assign(kBytes, 0);
    else a_ = Buf{be_.allocate(kBytes), DType::F32}, b_ = Buf{be_.allocate(kBytes), DType::F32};
  }
  ~BandwidthCopy() {
    if (!be_.host_memory()) be_.release(a_.ptr), be_.release(b_.ptr);
  }
  void run() {
    if (!be_.host_memory()) return be_.convert(b_, a_, kBytes / 4);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < 64; ++c) std::memcpy(host_b_.data() + c * (kBytes / 64), host_a_.data() + c * (kBytes / 64), kBytes / 64);
  }

 private:
  Backend& be_;
  std::vector<char> host_a_, host_b_;
  Buf a_{}, b_{};
};
// One optimizer's timings: its full step (Optimizer, every tensor) and the matrix parameters alone
// through its rule's multi-tensor entry (`items`, each with its own states), the best over rounds.
struct OptimRow {
  OptimizerKind kind;
  std::string name;
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<TensorRule> rule;
  RunConfig run;
  std::vector<void*> states;                   // the matrices' optimizer states (allocations)
  std::vector<std::array<Buf, 2>> state_bufs;  // ... per matrix
  std::vector<RuleItem> items;                 // one per matrix
  double full_s = 1e30, matrix_s = 1e30, one_by_one_s = 1e30;
};

bool is_matrix(const TensorSpec& t) { return t.group() == TensorGroup::Attention || t.group() == TensorGroup::Mlp; }

// Whether a device backend splits some of the model's SWAN products (optimizer.swan.ns_products):
// then SWAN is timed with FP32 products too, for the comparison.
bool splits_swan_products(const Backend& be, const LlamaModel& model, const RunConfig& run) {
  if (be.host_memory() || run.optimizer.swan.ns_products == SwanProducts::Fp32) return false;
  for (const auto& t : model.tensors())
    if (is_matrix(t) && cuda_scratch::swan_split_tf32(swan_split_from_k(run.optimizer.swan.ns_products), std::min(t.rows(), t.cols()))) return true;
  return false;
}

// Adam, SinkGD and SWAN over the model (and SWAN with FP32 products, "swan_fp32", where a device
// splits them), warmed up (workspace sizing, primitive creation), each with its matrix items and
// their states built once, outside the timings.
std::vector<OptimRow> make_rows(Backend& be, LlamaModel& model, const RunConfig& base) {
  std::vector<OptimRow> rows;
  const int64_t sb = dtype_bytes(base.precision.optimizer_states);
  std::vector<OptimizerKind> kinds{OptimizerKind::Adam, OptimizerKind::SinkGD, OptimizerKind::Swan};
  if (splits_swan_products(be, model, base)) kinds.push_back(OptimizerKind::Swan);
  for (size_t i = 0; i < kinds.size(); ++i) {
    const OptimizerKind kind = kinds[i];
    OptimRow r;
    r.kind = kind;
    r.name = choice_name(kind) + (i == 3 ? "_fp32" : "");
    r.run = base;
    r.run.optimizer.name = kind;
    if (i == 3) r.run.optimizer.swan.ns_products = SwanProducts::Fp32;
    r.opt = std::make_unique<Optimizer>(model.store(), r.run);
    r.opt->step(1, 1);
    r.rule = make_rule(kind, r.run.optimizer);
    for (const auto& t : model.tensors()) {
      if (!is_matrix(t)) continue;
      std::array<Buf, 2>& st = r.state_bufs.emplace_back();
      for (int k = 0; k < r.rule->state_slots(); ++k) {
        r.states.push_back(be.allocate(t.numel() * sb));
        st[k] = Buf{r.states.back(), r.run.precision.optimizer_states};
      }
      UpdateContext ctx;
      ctx.lr = 1e-3f;
      ctx.update = 2;
      ctx.tensor = r.items.size();
      r.items.push_back({&t, model.param(t), model.grad(t), nullptr, ctx});
    }
    for (size_t i = 0; i < r.items.size(); ++i) r.items[i].states = r.state_bufs[i].data();  // state_bufs no longer grows
    rows.push_back(std::move(r));
  }
  return rows;
}

// One more full step of an optimizer with the backend's per-kernel profile (eager: profiling waits
// on every launch's events), each kernel beside its roofline time on `peak` from the cost model's
// record of the same update (kernel_costs.h); empty on a backend without device kernels.
json profile_step(Backend& be, OptimRow& r, const OptimBenchOptions& o) {
  be.set_profiling(true);
  be.take_profile();
  r.opt->step(2, 2);
  const std::vector<KernelTime> times = be.take_profile();
  be.set_profiling(false);
  std::map<std::string, KernelCost> costs;
  const DevicePeak* peak = o.peak.empty() ? nullptr : find_device_peak(o.peak);
  if (peak)
    for (const KernelCost& k : record_step_costs(r.run, r.run.precision.params, 1, 2).update) {
      KernelCost& sum = costs.emplace(k.name, KernelCost{k.name, k.unit, 0, 0, 0}).first->second;
      sum.launches += k.launches, sum.bytes += k.bytes, sum.flops += k.flops;
    }
  json rows = json::array();
  for (const KernelTime& t : times) {
    json row = {{"name", t.name}, {"launches", t.launches}, {"ms", t.ms}};
    if (auto it = costs.find(t.name); it != costs.end())
      row["predicted_ms"] = roofline_seconds(it->second, *peak, peak->assume) * 1e3, row["predicted_launches"] = it->second.launches;
    rows.push_back(row);
  }
  return rows;
}

void print_profile(const std::string& name, const json& rows, const std::string& peak) {
  if (rows.empty()) return void(std::printf("  %s: no kernel profile on this backend\n", name.c_str()));
  double total = 0;
  for (const auto& k : rows) total += k["ms"].get<double>();
  std::printf("  %s, one step's kernels (eager, CUDA events): %.3f ms in all%s\n", name.c_str(), total,
              peak.empty() ? "" : (", predicted on " + peak).c_str());
  std::printf("    %-34s %8s %10s %12s\n", "kernel", "launches", "ms", "predicted ms");
  for (const auto& k : rows) {
    std::printf("    %-34s %8lld %10.3f", k["name"].get<std::string>().c_str(), static_cast<long long>(k["launches"].get<int64_t>()), k["ms"].get<double>());
    if (k.contains("predicted_ms")) std::printf(" %12.3f", k["predicted_ms"].get<double>());
    std::printf("\n");
  }
}

// The ratios and bandwidths of the timed rows (Adam, SinkGD, SWAN), as JSON or text.
void report(const OptimBenchOptions& o, const RunConfig& base, int threads, const std::vector<OptimRow>& rows, int64_t matrix_elems,
            double copy_s, const json& profiles) {
  const int64_t pb = dtype_bytes(base.precision.params), sb = dtype_bytes(base.precision.optimizer_states);
  const double copy_gbs = 2.0 * BandwidthCopy::kBytes / copy_s / 1e9;
  const int L = static_cast<int>(base.optimizer.sinkgd.iterations);
  // Bytes each rule's algorithm must move per matrix element: Adam reads g, m, v, w and writes m, v, w;
  // SinkGD reads g L + 1 times (one pass an iteration, as the CPU backend's) and reads and writes w.
  // The CUDA backend reads g 2 L + 1 times (sinkgd.cu), so its figure is the algorithm's rate, not DRAM's.
  const double adam_bytes = static_cast<double>(matrix_elems) * (2 * pb + 5 * sb);
  const double sinkgd_bytes = static_cast<double>(matrix_elems) * ((L + 1) * pb + 2 * pb);
  // Where g's rows stay in cache between passes, memory sees one read of g and the read and write of
  // w: the time that takes at the copy bandwidth is the floor of a SinkGD step.
  const double floor_s = static_cast<double>(matrix_elems) * 3 * pb / (copy_gbs * 1e9);
  const OptimRow &adam = rows[0], &sinkgd = rows[1], &swan = rows[2];
  if (o.json) {
    json j = {{"model", base.model.name}, {"precision", o.precision}, {"threads", threads}, {"copy_gb_s", copy_gbs}};
    for (const auto& r : rows)
      j["optimizers"][r.name] = {{"step_s", r.full_s}, {"matrix_params_s", r.matrix_s}, {"state_bytes", r.opt->state_bytes()},
                                 {"matrix_state_bytes", r.opt->matrix_state_bytes()}};
    j["sinkgd_over_adam"] = sinkgd.full_s / adam.full_s;
    j["sinkgd_over_adam_matrix_params"] = sinkgd.matrix_s / adam.matrix_s;
    j["sinkgd_one_tensor_per_call_s"] = sinkgd.one_by_one_s;
    j["swan_over_sinkgd"] = swan.full_s / sinkgd.full_s;
    if (rows.size() > 3) j["swan_over_swan_fp32"] = swan.full_s / rows[3].full_s;
    j["sinkgd_gb_s"] = sinkgd_bytes / sinkgd.matrix_s / 1e9;
    j["adam_gb_s"] = adam_bytes / adam.matrix_s / 1e9;
    j["sinkgd_memory_floor_s"] = floor_s;
    if (!profiles.empty()) j["profiles"] = profiles, j["profile_peak"] = o.peak;
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("  SinkGD / Adam: %.2f (full step; target <= 1.0), %.2f (matrix params)\n", sinkgd.full_s / adam.full_s,
              sinkgd.matrix_s / adam.matrix_s);
  std::printf("  SinkGD matrices one tensor per call: %.4f s; the multi-tensor op takes %.2fx that\n", sinkgd.one_by_one_s,
              sinkgd.matrix_s / sinkgd.one_by_one_s);
  std::printf("  SWAN / SinkGD: %.1f\n", swan.full_s / sinkgd.full_s);
  if (rows.size() > 3)
    std::printf("  SWAN with split TF32 products (from k = %lld) / with FP32 products: %.2f\n",
                static_cast<long long>(swan_split_from_k(base.optimizer.swan.ns_products)), swan.full_s / rows[3].full_s);
  std::printf("  memory copy: %.1f GB/s; SinkGD moves %.1f GB/s (%.0f%% of copy, L = %d, L + 1 reads of g counted), "
              "Adam %.1f GB/s (%.0f%%)\n",
              copy_gbs, sinkgd_bytes / sinkgd.matrix_s / 1e9, 100 * sinkgd_bytes / sinkgd.matrix_s / 1e9 / copy_gbs, L,
              adam_bytes / adam.matrix_s / 1e9, 100 * adam_bytes / adam.matrix_s / 1e9 / copy_gbs);
  std::printf("  SinkGD memory floor (g once, w read and written): %.4f s; the step takes %.1fx it\n", floor_s, sinkgd.matrix_s / floor_s);
  for (const auto& r : rows)
    if (profiles.contains(r.name)) print_profile(r.name, profiles[r.name], o.peak);
}
}  // namespace

void bench_optim(const OptimBenchOptions& o) {
  const json doc = read_json_file(o.config);
  json run_doc = is_model_config(doc) ? json{{"model", {{"config", doc}}}} : doc;
  if (!is_model_config(doc)) run_doc = load_run_config(o.config).resolved;
  run_doc["precision"] = {{"params", o.precision}, {"optimizer_states", o.precision}};
  run_doc["batch"] = {{"global_batch", 1}, {"micro_batch", 1}, {"seq_len", 2}};
  auto be = make_backend(choose_backend(o.backend), o.threads);
  RunConfig base = run_config_from_json(run_doc, o.config);
  if (is_model_config(doc)) base.model.name = load_model_config(o.config).name;
  // The weights stay as allocated (zeros): no rule's cost depends on their values, and drawing
  // llama_1b's 1.34e9 on the host took seconds before the first timing.
  LlamaModel model(*be, base.model, base.precision.params, 1, 2);
  fill_gradients(*be, model);
  int64_t matrix_elems = 0;
  for (const auto& t : model.tensors())
    if (is_matrix(t)) matrix_elems += t.numel();

  BandwidthCopy copy(*be);
  // The matrix parameters alone go through the same rule and its multi-tensor entry (as the optimizer
  // calls it), or one tensor per call (`one_by_one`: what the multi-tensor entry buys).
  std::vector<OptimRow> rows = make_rows(*be, model, base);
  auto matrix_step = [&](OptimRow& r, bool one_by_one) {
    if (!one_by_one) return r.rule->update_many(be->optimizer_kernels(), r.items);
    for (const RuleItem& it : r.items) r.rule->update(be->optimizer_kernels(), *it.tensor, it.w, it.g, it.states, it.ctx);
  };
  // Rounds: the copy, then Adam's and SinkGD's full step and matrix step, so every ratio compares
  // timings taken under the same conditions (this machine's bandwidth drifts by tens of percent
  // between seconds); the best of each over the rounds. Then SWAN, ~10-100x slower, in rounds of its
  // own (three; one on a device). Each optimizer's line is printed as it finishes (on stderr with
  // --json, whose document comes at the end).
  FILE* progress = o.json ? stderr : stdout;
  const int swan_rounds = be->host_memory() ? std::min(o.steps, 3) : 1;
  if (!o.json)
    std::printf("bench optim: %s, %s weights and states, %d threads, best of %d interleaved rounds (SWAN: %d)\n", base.model.name.c_str(),
                o.precision.c_str(), be->threads(), o.steps, swan_rounds);
  auto print_row = [&](const OptimRow& r) {
    std::fprintf(progress, "  %-9s %10.4f s full step %10.4f s matrix params %10.1f MiB state (matrices: %.1f MiB)\n", r.name.c_str(), r.full_s,
                 r.matrix_s, r.opt->state_bytes() / 1048576.0, r.opt->matrix_state_bytes() / 1048576.0);
    std::fflush(progress);
  };
  auto time_rule = [&](OptimRow& r) {
    r.full_s = std::min(r.full_s, timed(*be, [&] { r.opt->step(2, 2); }));
    r.matrix_s = std::min(r.matrix_s, timed(*be, [&] { matrix_step(r, false); }));
    if (r.kind == OptimizerKind::SinkGD) r.one_by_one_s = std::min(r.one_by_one_s, timed(*be, [&] { matrix_step(r, true); }));
  };
  double copy_s = 1e30;
  for (int round = 0; round < o.steps; ++round) {
    copy_s = std::min(copy_s, timed(*be, [&] { copy.run(); }));
    for (auto& r : rows)
      if (r.kind != OptimizerKind::Swan) time_rule(r);
  }
  for (const auto& r : rows)
    if (r.kind != OptimizerKind::Swan) print_row(r);
  for (size_t i = 2; i < rows.size(); ++i) {  // SWAN, then SWAN with FP32 products
    for (int round = 0; round < swan_rounds; ++round) time_rule(rows[i]);
    print_row(rows[i]);
  }
  json profiles = json::object();
  if (o.profile)
    for (auto& r : rows) profiles[r.name] = profile_step(*be, r, o);
  for (auto& r : rows)
    for (void* p : r.states) be->release(p);
  report(o, base, be->threads(), rows, matrix_elems, copy_s, profiles);
}

}  // namespace multinorm
