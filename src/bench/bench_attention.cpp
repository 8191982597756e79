// `multinorm bench attention`: the causal attention kernels alone (Backend::attention_forward and
// attention_backward), timed through the backend's queue, in TFLOP/s. What scripts/gpu_check.sh sets
// beside PyTorch's scaled_dot_product_attention (bench/attention_sdpa.py) on the same shapes.
//
// FLOPs, FlashAttention's convention so the figures compare with its papers: a causal forward does
// QK^T and PV over the T(T+1)/2 (query, key) pairs of each head, 2 x D FLOPs each, so
// 4 x B x H x D x T(T+1)/2; the backward counts 2.5x the forward (five products to the forward's two,
// the recomputation of S not counted). FlashAttention's own benchmark divides T^2 by 2 instead of
// T(T+1): 0.4% fewer at T = 256.
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "multinorm/backend.h"
#include "multinorm/bench.h"
#include "multinorm/device.h"
#include "multinorm/error.h"
#include "multinorm/json_file.h"

namespace multinorm {

namespace {

using Clock = std::chrono::steady_clock;

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
    fill_normal(qkv, rows * 3 * H * D, 1);
    fill_normal(dout, rows * H * D, 2);
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
  // N(0, 1) drawn on the host, uploaded as FP32 and converted where the buffer is: the host never
  // writes device memory directly.
  void fill_normal(Buf dst, int64_t n, uint32_t seed) {
    std::vector<float> host(static_cast<size_t>(n));
    std::mt19937 gen(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (float& x : host) x = d(gen);
    void* staging = be.allocate(n * 4);
    be.to_device(staging, host.data(), n * 4);
    be.convert(dst, Buf{staging, DType::F32}, n);
    be.queue().wait_all();
    be.release(staging);
  }
};

// Seconds per call of fn, over `steps` calls queued back to back: the queue drained before, a fence
// after the last call waited for (a device backend's launches return before they run).
double seconds_per_call(Backend& be, int64_t steps, const std::function<void()>& fn) {
  WorkQueue& q = be.queue();
  q.wait_all();
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < steps; ++i) fn();
  q.wait(q.fence());
  return std::chrono::duration<double>(Clock::now() - t0).count() / static_cast<double>(steps);
}

void check_options(const AttentionBenchOptions& o) {
  auto positive = [](int64_t v, const char* option) {
    if (v < 1) throw ConfigError(std::string("bench attention: ") + option + " must be at least 1 (got " + std::to_string(v) + ")");
  };
  positive(o.batch, "--batch");
  positive(o.heads, "--heads");
  positive(o.seq, "--seq");
  positive(o.head_dim, "--head-dim");
  positive(o.steps, "--steps");
  if (o.warmup < 0) throw ConfigError("bench attention: --warmup must not be negative (got " + std::to_string(o.warmup) + ")");
}

}  // namespace

double attention_forward_flops(int64_t B, int64_t H, int64_t T, int64_t D) {
  return 4.0 * static_cast<double>(B) * static_cast<double>(H) * static_cast<double>(D) * static_cast<double>(T) *
         static_cast<double>(T + 1) / 2.0;
}

void bench_attention(const AttentionBenchOptions& o) {
  check_options(o);
  const DType dt = parse_dtype(o.precision);
  const int64_t B = o.batch, H = o.heads, T = o.seq, D = o.head_dim;
  auto be = make_backend(choose_backend(o.backend), o.threads);
  AttentionOperands a(*be, dt, B, T, H, D);
  auto forward = [&] { be->attention_forward(a.out, a.lse, a.qkv, B, T, H, D); };
  auto forward_backward = [&] {
    forward();
    be->attention_backward(a.dqkv, a.dout, a.qkv, a.out, a.lse, B, T, H, D);
  };
  for (int64_t i = 0; i < o.warmup; ++i) forward_backward();
  const double fwd_s = seconds_per_call(*be, o.steps, forward);
  const double fb_s = seconds_per_call(*be, o.steps, forward_backward);
  const double fwd_flops = attention_forward_flops(B, H, T, D), bwd_flops = 2.5 * fwd_flops;
  const double fwd_tflops = fwd_flops / fwd_s / 1e12, fb_tflops = (fwd_flops + bwd_flops) / fb_s / 1e12;
  const double bwd_s = fb_s - fwd_s;
  if (o.json) {
    const json j = {{"backend", be->name()}, {"batch", B}, {"heads", H}, {"seq", T}, {"head_dim", D}, {"precision", o.precision},
                    {"causal", true}, {"steps", o.steps}, {"warmup", o.warmup}, {"forward_s", fwd_s}, {"forward_backward_s", fb_s},
                    {"forward_flops", fwd_flops}, {"backward_flops", bwd_flops}, {"forward_tflops", fwd_tflops},
                    {"forward_backward_tflops", fb_tflops}, {"backward_tflops", bwd_s > 0 ? bwd_flops / bwd_s / 1e12 : 0.0},
                    {"flops", "causal: 4 B H D T(T+1)/2 forward, 2.5x that backward (FlashAttention's convention)"}};
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("bench attention: backend %s, batch %lld x %lld heads x %lld positions x head dim %lld, %s, causal; %lld calls after %lld warm-up\n",
              be->name().c_str(), (long long)B, (long long)H, (long long)T, (long long)D, o.precision.c_str(), (long long)o.steps,
              (long long)o.warmup);
  std::printf("  forward            %12.3f ms   %9.3f TFLOP/s\n", fwd_s * 1e3, fwd_tflops);
  std::printf("  forward+backward   %12.3f ms   %9.3f TFLOP/s\n", fb_s * 1e3, fb_tflops);
  std::printf("  backward (the difference) %5.3f ms   %9.3f TFLOP/s\n", bwd_s * 1e3, bwd_s > 0 ? bwd_flops / bwd_s / 1e12 : 0.0);
  std::printf("  FLOPs: causal, 4 x B x H x D x T(T+1)/2 = %.4g forward, 2.5x that backward (FlashAttention's convention)\n", fwd_flops);
}

}  // namespace multinorm
