// `multinorm bench optim`: one optimizer step over a model's tensors, per optimizer, against Adam and
// against a memory-copy bandwidth measured in the same run (SinkGD is memory-bound).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

#include "multinorm/device.h"
#include "multinorm/bench.h"
#include "multinorm/json_file.h"
#include "multinorm/optimizer.h"

namespace multinorm {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Best of `reps` timings of fn().
// Best wall time of fn over reps, each timed to completion on the backend (a device backend's
// launches are asynchronous).
template <class Fn>
double best_time(Backend& be, int reps, Fn&& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    be.synchronize();
    const auto t = Clock::now();
    fn();
    be.synchronize();
    best = std::min(best, since(t));
  }
  return best;
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
  LlamaModel model(*be, base.model, base.precision.params, 1, 2);
  model.init_random(0);
  {  // gradients: N(0, 1e-3)
    std::vector<float> g(model.num_params());
    std::mt19937 gen(1);
    std::normal_distribution<float> d(0.0f, 1e-3f);
    for (auto& x : g) x = d(gen);
    void* staging = be->allocate(g.size() * 4);
    be->to_device(staging, g.data(), g.size() * 4);
    be->convert(model.grads(), Buf{staging, DType::F32}, model.num_params());
    be->release(staging);
  }
  int64_t matrix_elems = 0;
  for (const auto& t : model.tensors())
    if (t.group() == TensorGroup::Attention || t.group() == TensorGroup::Mlp) matrix_elems += t.numel();

  // Memory bandwidth: copy 256 MiB (read + write counted) in the backend's memory: host memcpy on
  // threads for the CPU, a device-to-device copy kernel (convert fp32 -> fp32) otherwise.
  double copy_gbs = 0;
  {
    const int64_t bytes = int64_t{256} << 20;
    double t = 0;
    if (be->host_memory()) {
      std::vector<char> a(bytes, 1), b(bytes, 0);
      t = best_time(*be, 3, [&] {
#pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < 64; ++c) std::memcpy(b.data() + c * (bytes / 64), a.data() + c * (bytes / 64), bytes / 64);
      });
    } else {
      const Buf a{be->allocate(bytes), DType::F32}, b{be->allocate(bytes), DType::F32};
      t = best_time(*be, 3, [&] { be->convert(b, a, bytes / 4); });
      be->release(a.ptr);
      be->release(b.ptr);
    }
    copy_gbs = 2.0 * bytes / t / 1e9;
  }

  struct Row {
    std::string name;
    double full_s, matrix_s;
    int64_t state_bytes, matrix_state_bytes;
  };
  std::vector<Row> rows;
  const int64_t pb = dtype_bytes(base.precision.params), sb = dtype_bytes(base.precision.optimizer_states);
  for (const std::string name : {"adam", "sinkgd", "swan"}) {
    RunConfig run = base;
    run.optimizer.name = name;
    Optimizer opt(model, run);
    opt.step(1, 1);  // warm-up: workspace sizing, primitive creation
    const double full = best_time(*be, o.steps, [&] { opt.step(2, 2); });
    // The matrix parameters alone, through the same rule.
    auto rule = make_rule(name, run.optimizer);
    std::vector<void*> states;
    const double matrix = best_time(*be, o.steps, [&] {
      uint64_t idx = 0;
      for (const auto& t : model.tensors()) {
        if (!(t.group() == TensorGroup::Attention || t.group() == TensorGroup::Mlp)) continue;
        Buf st[2];
        for (int k = 0; k < rule->state_slots(); ++k) {
          if (states.size() <= idx * 2 + k) states.push_back(be->allocate(t.numel() * sb));
          st[k] = Buf{states[idx * 2 + k], run.precision.optimizer_states};
        }
        UpdateContext ctx;
        ctx.lr = 1e-3f;
        ctx.update = 2;
        ctx.tensor = idx++;
        rule->update(*be, t, model.param(t), model.grad(t), st, ctx);
      }
    });
    for (void* p : states) be->release(p);
    rows.push_back({name, full, matrix, opt.state_bytes(), opt.matrix_state_bytes()});
  }
  const int L = static_cast<int>(base.optimizer.sinkgd.iterations);
  // Bytes each kernel must move per matrix element: Adam reads g, m, v, w and writes m, v, w;
  // SinkGD reads g L + 1 times and reads and writes w.
  const double adam_bytes = static_cast<double>(matrix_elems) * (2 * pb + 5 * sb);
  const double sinkgd_bytes = static_cast<double>(matrix_elems) * ((L + 1) * pb + 2 * pb);
  const Row &adam = rows[0], &sinkgd = rows[1], &swan = rows[2];
  if (o.json) {
    json j = {{"model", base.model.name}, {"precision", o.precision}, {"threads", be->threads()}, {"copy_gb_s", copy_gbs}};
    for (const auto& r : rows)
      j["optimizers"][r.name] = {{"step_s", r.full_s}, {"matrix_params_s", r.matrix_s}, {"state_bytes", r.state_bytes},
                                 {"matrix_state_bytes", r.matrix_state_bytes}};
    j["sinkgd_over_adam"] = sinkgd.full_s / adam.full_s;
    j["sinkgd_over_adam_matrix_params"] = sinkgd.matrix_s / adam.matrix_s;
    j["swan_over_sinkgd"] = swan.full_s / sinkgd.full_s;
    j["sinkgd_gb_s"] = sinkgd_bytes / sinkgd.matrix_s / 1e9;
    j["adam_gb_s"] = adam_bytes / adam.matrix_s / 1e9;
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("bench optim: %s, %s weights and states, %d threads, best of %d\n", base.model.name.c_str(),
              o.precision.c_str(), be->threads(), o.steps);
  std::printf("  %-8s %12s %16s %18s\n", "", "full step", "matrix params", "optimizer state");
  for (const auto& r : rows)
    std::printf("  %-8s %10.4f s %14.4f s %12.1f MiB (matrices: %.1f MiB)\n", r.name.c_str(), r.full_s, r.matrix_s,
                r.state_bytes / 1048576.0, r.matrix_state_bytes / 1048576.0);
  std::printf("  SinkGD / Adam: %.2f (full step), %.2f (matrix params; target <= 1.1)\n", sinkgd.full_s / adam.full_s,
              sinkgd.matrix_s / adam.matrix_s);
  std::printf("  SWAN / SinkGD: %.1f\n", swan.full_s / sinkgd.full_s);
  std::printf("  memory copy: %.1f GB/s; SinkGD moves %.1f GB/s (%.0f%% of copy, L = %d), Adam %.1f GB/s (%.0f%%)\n",
              copy_gbs, sinkgd_bytes / sinkgd.matrix_s / 1e9, 100 * sinkgd_bytes / sinkgd.matrix_s / 1e9 / copy_gbs, L,
              adam_bytes / adam.matrix_s / 1e9, 100 * adam_bytes / adam.matrix_s / 1e9 / copy_gbs);
}

}  // namespace multinorm
