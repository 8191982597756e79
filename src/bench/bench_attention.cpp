// `multinorm bench attention`: the causal attention kernels alone (Backend::attention_forward and
// attention_backward), timed through the backend's queue, in TFLOP/s. What scripts/gpu_check.sh sets
// beside PyTorch's scaled_dot_product_attention (bench/attention_sdpa.py) on the same shapes.
//
// FLOPs, FlashAttention's convention so the figures compare with its papers: a causal forward does
// QK^T and PV over the T(T+1)/2 (query, key) pairs of each head, 2 x D FLOPs each, so
// 4 x B x H x D x T(T+1)/2; the backward counts 2.5x the forward (five products to the forward's two,
// the recomputation of S not counted). FlashAttention's own benchmark divides T^2 by 2 instead of
// T(T+1): 0.4% fewer at T = 256.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "multinorm/backend.h"
#include "multinorm/bench.h"
#include "multinorm/device.h"
#include "multinorm/error.h"
#include "multinorm/json_file.h"
#include "bench_kernels.h"

namespace multinorm {

namespace {

using namespace bench_kernels;

// The operands of one attention call, in the backend's memory.
struct AttentionOperands {
  Backend& be;
  Buf qkv, out, dout, dqkv;
  float* lse = nullptr;
  std::vector<void*> owned;

  AttentionOperands(Backend& backend, DType dt, int64_t B, int64_t T, int64_t H, int64_t D) : be(backend) {
    const int64_t rows = B * T;
    qkv = {allocate(rows * 3 * H * D * dtype_bytes(dt)), dt};
    out = {allocate(rows * H * D * dtype_bytes(dt)), dt};
    dout = {allocate(rows * H * D * dtype_bytes(dt)), dt};
    dqkv = {allocate(rows * 3 * H * D * dtype_bytes(dt)), dt};
    lse = static_cast<float*>(allocate(B * H * T * 4));
    fill_normal(be, qkv, rows * 3 * H * D, 1);
    fill_normal(be, dout, rows * H * D, 2);
  }
  ~AttentionOperands() {
    for (void* p : owned) be.release(p);
  }
  AttentionOperands(const AttentionOperands&) = delete;
  AttentionOperands& operator=(const AttentionOperands&) = delete;

  void* allocate(int64_t bytes) {
    owned.push_back(be.allocate(bytes));
    return owned.back();
  }
};

struct Shape {
  int64_t B, H, T, D;
};

// --shapes BxHxTxD,... (the option may repeat), else the single shape of --batch/--heads/--seq/--head-dim.
std::vector<Shape> shapes_of(const AttentionBenchOptions& o) {
  if (o.shapes.empty()) return {{o.batch, o.heads, o.seq, o.head_dim}};
  std::vector<Shape> out;
  for (const std::string& s : o.shapes) {
    int64_t v[4] = {0, 0, 0, 0};
    size_t at = 0;
    int k = 0;
    for (; k < 4; ++k) {
      size_t used = 0;
      try {
        v[k] = std::stoll(s.substr(at), &used);
      } catch (const std::exception&) {
        break;
      }
      at += used;
      if (k < 3) {
        if (at >= s.size() || (s[at] != 'x' && s[at] != 'X')) break;
        ++at;
      }
    }
    if (k < 4 || at != s.size())
      throw ConfigError("bench attention --shapes: '" + s + "' is not BATCHxHEADSxSEQxHEAD_DIM (e.g. 16x32x1024x64)");
    out.push_back({v[0], v[1], v[2], v[3]});
  }
  return out;
}

void check_options(const AttentionBenchOptions& o, const std::vector<Shape>& shapes) {
  auto positive = [](int64_t v, const char* option) {
    if (v < 1) throw ConfigError(std::string("bench attention: ") + option + " must be at least 1 (got " + std::to_string(v) + ")");
  };
  for (const Shape& s : shapes) {
    positive(s.B, "--batch");
    positive(s.H, "--heads");
    positive(s.T, "--seq");
    positive(s.D, "--head-dim");
  }
  positive(o.steps, "--steps");
  if (o.warmup < 0) throw ConfigError("bench attention: --warmup must not be negative (got " + std::to_string(o.warmup) + ")");
  if (!(o.warmup_ms >= 0) || !(o.min_ms >= 0)) throw ConfigError("bench attention: --warmup-ms and --min-ms must not be negative");
}

}  // namespace

double attention_forward_flops(int64_t B, int64_t H, int64_t T, int64_t D) {
  return 4.0 * static_cast<double>(B) * static_cast<double>(H) * static_cast<double>(D) * static_cast<double>(T) *
         static_cast<double>(T + 1) / 2.0;
}

void bench_attention(const AttentionBenchOptions& o) {
  const std::vector<Shape> shapes = shapes_of(o);
  check_options(o, shapes);
  const DType dt = parse_dtype(o.precision);
  auto be = make_backend(choose_backend(o.backend), o.threads);
  for (const Shape& shape : shapes) {
    const int64_t B = shape.B, H = shape.H, T = shape.T, D = shape.D;
    AttentionOperands a(*be, dt, B, T, H, D);
    auto forward = [&] { be->attention_forward(a.out, a.lse, a.qkv, B, T, H, D); };
    auto forward_backward = [&] {
      forward();
      be->attention_backward(a.dqkv, a.dout, a.qkv, a.out, a.lse, B, T, H, D);
    };
    const auto w0 = Clock::now();
    const int64_t warmup_calls = warm_up(*be, o.warmup, o.warmup_ms / 1e3, forward_backward);
    const double warmup_s = since(w0);
    int64_t fwd_calls = 0, fb_calls = 0;
    const double fwd_s = seconds_per_call(*be, o.steps, o.min_ms / 1e3, forward, fwd_calls);
    const double fb_s = seconds_per_call(*be, o.steps, o.min_ms / 1e3, forward_backward, fb_calls);
    const double fwd_flops = attention_forward_flops(B, H, T, D), bwd_flops = 2.5 * fwd_flops;
    const double fwd_tflops = fwd_flops / fwd_s / 1e12, fb_tflops = (fwd_flops + bwd_flops) / fb_s / 1e12;
    const double bwd_s = fb_s - fwd_s;
    if (o.json) {  // one line per shape
      const json j = {{"backend", be->name()}, {"batch", B}, {"heads", H}, {"seq", T}, {"head_dim", D}, {"precision", o.precision},
                      {"causal", true}, {"forward_calls", fwd_calls}, {"forward_backward_calls", fb_calls}, {"warmup_calls", warmup_calls},
                      {"warmup_s", warmup_s}, {"forward_s", fwd_s}, {"forward_backward_s", fb_s},
                      {"forward_flops", fwd_flops}, {"backward_flops", bwd_flops}, {"forward_tflops", fwd_tflops},
                      {"forward_backward_tflops", fb_tflops}, {"backward_tflops", bwd_s > 0 ? bwd_flops / bwd_s / 1e12 : 0.0},
                      {"flops", "causal: 4 B H D T(T+1)/2 forward, 2.5x that backward (FlashAttention's convention)"}};
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);  // a caller that stops this keeps the shapes done
      continue;
    }
    std::printf("bench attention: backend %s, batch %lld x %lld heads x %lld positions x head dim %lld, %s, causal; "
                "%lld + %lld calls after %lld warm-up (%.0f ms)\n",
                be->name().c_str(), (long long)B, (long long)H, (long long)T, (long long)D, o.precision.c_str(), (long long)fwd_calls,
                (long long)fb_calls, (long long)warmup_calls, warmup_s * 1e3);
    std::printf("  forward            %12.3f ms   %9.3f TFLOP/s\n", fwd_s * 1e3, fwd_tflops);
    std::printf("  forward+backward   %12.3f ms   %9.3f TFLOP/s\n", fb_s * 1e3, fb_tflops);
    std::printf("  backward (the difference) %5.3f ms   %9.3f TFLOP/s\n", bwd_s * 1e3, bwd_s > 0 ? bwd_flops / bwd_s / 1e12 : 0.0);
    std::printf("  FLOPs: causal, 4 x B x H x D x T(T+1)/2 = %.4g forward, 2.5x that backward (FlashAttention's convention)\n", fwd_flops);
    std::fflush(stdout);
  }
}

}  // namespace multinorm
