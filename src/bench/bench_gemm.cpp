// `multinorm bench gemm`: GEMMs alone through Backend::matmul, each against the device's own square
// GEMM timed in the same run. With -c MODEL, every GEMM of the model's training micro-batch as the
// backend runs it (cuda_training_gemm_calls: the MLP's activations in the plan's padded rows, the
// down projection's weight and gradient in the arenas' (layout_arena); any other operand off 16 bytes
// staged through copy_rows, the copies timed with its GEMM), and beside each
// the same product with M, N and K rounded up to multiples of 64 and dense rows: what padding the
// model's widths would give. With --shapes, any products.
//
// FLOPs: 2 M N K of the logical product (a padded extent's zeros not counted), so a slow layout
// shows as a low TFLOP/s.
#include <cstdio>
#include <string>
#include <vector>

#include "multinorm/bench.h"
#include "multinorm/cuda_scratch.h"
#include "multinorm/device.h"
#include "multinorm/error.h"
#include "multinorm/json_file.h"
#include "multinorm/memory_estimate.h"
#include "multinorm/model_config.h"
#include "bench_kernels.h"

namespace multinorm {

namespace {

using namespace bench_kernels;

// The operands of one call in the backend's memory, each with the row stride it is stored with.
struct GemmOperands {
  Backend& be;
  Buf a, b, out;
  std::vector<void*> owned;

  GemmOperands(Backend& backend, const cuda_scratch::GemmStaging& st, DType in, DType out_dtype) : be(backend) {
    a = make(st.a, in, 1), b = make(st.b, in, 2), out = make(st.out, out_dtype, 3);
  }
  ~GemmOperands() {
    for (void* p : owned) be.release(p);
  }
  GemmOperands(const GemmOperands&) = delete;
  GemmOperands& operator=(const GemmOperands&) = delete;

  Buf make(const cuda_scratch::GemmOperand& o, DType dt, uint32_t seed) {
    owned.push_back(be.allocate(o.rows * o.stride * dtype_bytes(dt)));
    const Buf x{owned.back(), dt, o.stride != o.cols ? o.stride : 0};
    // Every element drawn, a padded operand's padding too: values do not change a GEMM's time (the
    // model keeps zeros there, which only the sums see), and zeros would draw less power than a
    // model's operands.
    fill_normal(be, Buf{x.ptr, dt}, o.rows * o.stride, seed);
    return x;
  }
};

// "MxNxK" or "MxNxK:OPS", OPS two letters n or t (op(a), op(b)), as BLAS names them.
GemmCall parse_shape(const std::string& s, int64_t in_bytes) {
  int64_t v[3] = {0, 0, 0};
  size_t at = 0;
  bool ok = true;
  for (int k = 0; k < 3 && ok; ++k) {
    size_t used = 0;
    try {
      v[k] = std::stoll(s.substr(at), &used);
    } catch (const std::exception&) {
      ok = false;
      break;
    }
    at += used;
    if (k < 2) ok = at < s.size() && (s[at] == 'x' || s[at] == 'X'), ++at;
  }
  bool ta = false, tb = false;
  if (ok && at < s.size()) {
    ok = s.size() == at + 3 && s[at] == ':' && (s[at + 1] == 'n' || s[at + 1] == 't') && (s[at + 2] == 'n' || s[at + 2] == 't');
    if (ok) ta = s[at + 1] == 't', tb = s[at + 2] == 't';
  }
  if (!ok || v[0] < 1 || v[1] < 1 || v[2] < 1)
    throw ConfigError("bench gemm --shapes: '" + s + "' is not MxNxK or MxNxK:OPS with positive sizes and OPS two of n, t (e.g. 8192x10922x2048:nt)");
  return GemmCall{s, 1, v[0], v[1], v[2], ta, tb, false, in_bytes, in_bytes};
}

std::vector<GemmCall> products(const GemmBenchOptions& o, DType dt) {
  std::vector<GemmCall> out;
  for (const std::string& s : o.shapes) out.push_back(parse_shape(s, dtype_bytes(dt)));
  if (!o.config.empty()) {
    const ModelConfig cfg = load_model_config(o.config);
    for (const GemmCall& c : cuda_training_gemm_calls(cfg, o.batch * o.seq, dt, dt)) out.push_back(c);
  }
  return out;
}

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }
DType dtype_of_bytes(int64_t bytes) { return bytes == 4 ? DType::F32 : DType::BF16; }

struct Timing {
  double seconds = 0;
  int64_t calls = 0;
};

// Seconds per call of one product on operands stored as `layout` stores them.
Timing time_call(Backend& be, const GemmCall& c, const ActivationLayout& layout, const GemmBenchOptions& o) {
  const cuda_scratch::GemmStaging st = cuda_gemm_call_staging(c, layout);
  GemmOperands x(be, st, dtype_of_bytes(c.in), dtype_of_bytes(c.out));
  auto call = [&] { be.matmul(x.out, x.a, x.b, c.M, c.N, c.K, c.ta, c.tb, c.accumulate); };
  warm_up(be, 2, o.warmup_ms / 1e3, call);
  Timing t;
  t.seconds = seconds_per_call(be, o.steps, o.min_ms / 1e3, call, t.calls);
  return t;
}

double tflops(const GemmCall& c, double seconds) { return 2.0 * c.M * c.N * c.K / seconds / 1e12; }

}  // namespace

void bench_gemm(const GemmBenchOptions& o) {
  if (o.batch < 1 || o.seq < 1 || o.steps < 1 || o.reference < 1) throw ConfigError("bench gemm: --batch, --seq, --steps and --reference must be at least 1");
  if (!(o.warmup_ms >= 0) || !(o.min_ms >= 0)) throw ConfigError("bench gemm: --warmup-ms and --min-ms must not be negative");
  if (o.config.empty() && o.shapes.empty()) throw ConfigError("bench gemm: name a model (-c) or products (--shapes)");
  const DType dt = parse_dtype(o.precision);
  const std::vector<GemmCall> list = products(o, dt);
  auto be = make_backend(choose_backend(o.backend), o.threads);
  const ActivationLayout layout = be->activation_layout(dt), dense{};
  const int64_t n = o.reference;
  const GemmCall square{"reference", 1, n, n, n, false, true, false, dtype_bytes(dt), dtype_bytes(dt)};
  const Timing ref = time_call(*be, square, dense, o);
  const double ref_tflops = tflops(square, ref.seconds);
  if (o.json) {
    std::printf("%s\n", json{{"backend", be->name()}, {"precision", o.precision}, {"reference", {{"m", n}, {"n", n}, {"k", n}, {"seconds", ref.seconds},
                                                                                               {"tflops", ref_tflops}}}}.dump().c_str());
  } else {
    std::printf("bench gemm: backend %s, %s; the reference %lldx%lldx%lld:nt runs at %.1f TFLOP/s (%.3f ms)\n", be->name().c_str(), o.precision.c_str(),
                (long long)n, (long long)n, (long long)n, ref_tflops, ref.seconds * 1e3);
    if (!o.config.empty())
      std::printf("  the model's GEMMs of a %lld x %lld micro-batch as the backend runs them (staging copies included); 'aligned': M, N, K rounded up\n"
                  "  to multiples of 64, dense rows\n", (long long)o.batch, (long long)o.seq);
    std::printf("  %-38s %5s %6s %6s %6s %3s %9s %8s %6s %9s %8s %8s\n", "product", "count", "M", "N", "K", "ops", "ms", "TFLOP/s", "of ref",
                "aligned", "TFLOP/s", "ms/step");
  }
  std::fflush(stdout);
  double step_s = 0, aligned_step_s = 0, step_flops = 0;  // the model's calls only (after --shapes' products)
  for (size_t i = 0; i < list.size(); ++i) {
    const GemmCall& c = list[i];
    const double in_step = i >= o.shapes.size() ? 1.0 : 0.0;
    GemmCall padded = c;
    padded.M = round_up(c.M, 64), padded.N = round_up(c.N, 64), padded.K = round_up(c.K, 64);
    padded.a_ld = padded.b_ld = padded.out_ld = 0;
    const Timing t = time_call(*be, c, layout, o);
    const Timing ta = time_call(*be, padded, dense, o);
    const double f = tflops(c, t.seconds), fa = tflops(padded, ta.seconds);
    step_s += in_step * c.count * t.seconds, aligned_step_s += in_step * c.count * ta.seconds;
    step_flops += in_step * c.count * 2.0 * c.M * c.N * c.K;
    const std::string ops = std::string(c.ta ? "t" : "n") + (c.tb ? "t" : "n");
    if (o.json) {
      std::printf("%s\n", json{{"product", c.name}, {"count", c.count}, {"m", c.M}, {"n", c.N}, {"k", c.K}, {"ops", ops}, {"accumulate", c.accumulate},
                               {"out_bytes", c.out}, {"seconds", t.seconds}, {"calls", t.calls}, {"tflops", f}, {"of_reference", f / ref_tflops},
                               {"aligned", {{"m", padded.M}, {"n", padded.N}, {"k", padded.K}, {"seconds", ta.seconds}, {"tflops", fa}}}}
                              .dump()
                              .c_str());
    } else {
      std::printf("  %-38s %5d %6lld %6lld %6lld %3s %9.3f %8.1f %5.0f%% %9.3f %8.1f %8.2f\n", c.name.c_str(), c.count, (long long)c.M, (long long)c.N,
                  (long long)c.K, ops.c_str(), t.seconds * 1e3, f, 100 * f / ref_tflops, ta.seconds * 1e3, fa, c.count * t.seconds * 1e3);
    }
    std::fflush(stdout);  // a caller that stops this keeps the products done
  }
  if (o.config.empty()) return;
  const double total_tflops = step_flops / step_s / 1e12;
  if (o.json) {
    std::printf("%s\n", json{{"total", {{"seconds", step_s}, {"tflops", total_tflops}, {"of_reference", total_tflops / ref_tflops},
                                        {"aligned_seconds", aligned_step_s}}}}
                            .dump()
                            .c_str());
  } else {
    std::printf("  a micro-batch's GEMMs: %.2f ms, %.1f TFLOP/s (%.0f%% of the reference); aligned: %.2f ms (%.2fx)\n", step_s * 1e3, total_tflops,
                100 * total_tflops / ref_tflops, aligned_step_s * 1e3, step_s / aligned_step_s);
  }
}

}  // namespace multinorm
