// The CUDA backend against the CPU backend at one model's shapes (doctor_checks.h). Tolerances, of
// the largest expected element: ops as the test suite's (tests/test_cuda_backend.cpp): FP32 outputs
// 1e-5, BF16 outputs 8e-3 (two BF16 ulps). Two training updates of a two-layer model at the model's
// widths, per tensor by its rule: SinkGD and SGD 1e-4, SWAN 3e-3, Adam 5e-2 (its early updates are
// lr x sign(g), so a gradient within rounding of zero moves its weight 2 lr the other way, 4 lr over
// two updates: 4e-3 of weights whose largest is ~0.1; measured 3.3e-2 at llama_tiny). The
// update bounds are wider than the tests' (1e-5, 1e-3), which were measured at width 32: at
// llama_tiny's width 256 the GEMMs' summation-order differences reach the weights as 2.0e-5 (SinkGD)
// and 3.3e-4 (SWAN) (emulated build, 2026-11-25). Checkpoints: bit for bit.
#include "doctor_checks.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include "../../kernels/common/bf16.h"
#include "multinorm/checkpoint.h"
#include "multinorm/error.h"
#include "multinorm/llama_model.h"
#include "multinorm/model_spec.h"
#include "multinorm/optimizer.h"
#include "multinorm/run_config.h"

namespace multinorm {
namespace {

constexpr double kF32 = 1e-5, kBf16 = 8e-3;
double tol(DType t) { return t == DType::F32 ? kF32 : kBf16; }

// Deterministic values in [-scale, scale): a hash of the index and seed.
float value_at(uint64_t i, uint32_t seed, float scale) {
  uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ULL ^ (uint64_t(seed) << 32);
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 32;
  return scale * (static_cast<float>(x & 0xffffff) / 8388608.0f - 1.0f);
}

// A buffer holding the same values on the CPU and the CUDA backend.
class Twin {
 public:
  Twin(Backend& cpu, Backend& gpu, int64_t n, DType t, uint32_t seed = 0, float scale = 1.0f) : cpu_(cpu), gpu_(gpu), n_(n), t_(t) {
    c_ = cpu.allocate(std::max<int64_t>(n, 1) * dtype_bytes(t));
    g_ = gpu.allocate(std::max<int64_t>(n, 1) * dtype_bytes(t));
    if (seed == 0) return;  // allocate() zero-fills
    if (t == DType::F32) {
      std::vector<float> h(n);
      for (int64_t i = 0; i < n; ++i) h[i] = value_at(i, seed, scale);
      cpu.to_device(c_, h.data(), n * 4), gpu.to_device(g_, h.data(), n * 4);
    } else {
      std::vector<bf16> h(n);
      for (int64_t i = 0; i < n; ++i) h[i] = to_bf16(value_at(i, seed, scale));
      cpu.to_device(c_, h.data(), n * 2), gpu.to_device(g_, h.data(), n * 2);
    }
  }
  ~Twin() { cpu_.release(c_), gpu_.release(g_); }
  Twin(const Twin&) = delete;
  Twin& operator=(const Twin&) = delete;
  Buf c() const { return {c_, t_}; }
  Buf g() const { return {g_, t_}; }
  float* cf() const { return static_cast<float*>(c_); }
  float* gf() const { return static_cast<float*>(g_); }
  std::vector<float> host(Backend& be, void* p) const {
    std::vector<float> out(n_);
    if (t_ == DType::F32) {
      be.to_host(out.data(), p, n_ * 4);
    } else {
      std::vector<bf16> h(n_);
      be.to_host(h.data(), p, n_ * 2);
      for (int64_t i = 0; i < n_; ++i) out[i] = to_f32(h[i]);
    }
    return out;
  }

 private:
  Backend &cpu_, &gpu_;
  int64_t n_;
  DType t_;
  void *c_, *g_;
};

// Token ids on both backends.
class Ids {
 public:
  Ids(Backend& cpu, Backend& gpu, const std::vector<int32_t>& ids) : cpu_(cpu), gpu_(gpu) {
    const int64_t bytes = std::max<int64_t>(static_cast<int64_t>(ids.size()) * 4, 4);
    c_ = cpu.allocate(bytes), g_ = gpu.allocate(bytes);
    cpu.to_device(c_, ids.data(), static_cast<int64_t>(ids.size()) * 4);
    gpu.to_device(g_, ids.data(), static_cast<int64_t>(ids.size()) * 4);
  }
  ~Ids() { cpu_.release(c_), gpu_.release(g_); }
  const int32_t* c() const { return static_cast<const int32_t*>(c_); }
  const int32_t* g() const { return static_cast<const int32_t*>(g_); }

 private:
  Backend &cpu_, &gpu_;
  void *c_, *g_;
};

std::string dims(std::initializer_list<int64_t> d) {
  std::string s;
  for (int64_t x : d) s += (s.empty() ? "" : "x") + std::to_string(x);
  return s;
}

}  // namespace

DoctorChecks::DoctorChecks(Backend& cpu, Backend& gpu, const ModelConfig& cfg, int64_t B, int64_t T)
    : cpu_(cpu), gpu_(gpu), cfg_(cfg), B_(B), T_(T) {}

void DoctorChecks::print(const DoctorCheck& c) const {
  std::string kernels;
  for (const auto& k : c.kernels) kernels += (kernels.empty() ? "" : ", ") + k;
  std::printf("  %-4s %-10s %-28s %-5s %-22s error %.2e (bound %.0e)%s%s\n", c.ok ? "ok" : "FAIL", c.section.c_str(), c.name.c_str(), c.dtype.c_str(),
              c.shape.c_str(), c.error, c.bound, c.ok ? "" : ("  kernels: " + kernels).c_str(), c.failure.empty() ? "" : ("  " + c.failure).c_str());
  std::fflush(stdout);
}

void DoctorChecks::check(const std::string& section, const std::string& name, DType t, const std::string& shape, double bound,
                         const std::function<std::vector<Output>()>& body) {
  DoctorCheck c;
  c.section = section, c.name = name, c.dtype = dtype_name(t), c.shape = shape, c.bound = bound;
  gpu_.take_profile();  // what earlier work left
  gpu_.set_profiling(true);
  try {
    for (const Output& o : body()) {
      double scale = 0, worst = 0;
      size_t at = 0;
      bool nan = false;
      for (float e : o.cpu) scale = std::max(scale, double(std::fabs(e)));
      for (size_t i = 0; i < o.cpu.size(); ++i) {
        const double d = std::fabs(double(o.gpu[i]) - o.cpu[i]);
        if (std::isnan(o.gpu[i]) && !std::isnan(o.cpu[i])) nan = true;
        if (!(d <= worst)) worst = d, at = i;
      }
      const double rel = scale > 0 ? worst / scale : worst, b = o.bound >= 0 ? o.bound : bound;
      if (!(rel <= c.error)) c.error = rel;
      c.outputs.push_back({o.label, rel, b});
      if (nan || !(rel <= b)) {
        c.ok = false;
        char buf[256];
        std::snprintf(buf, sizeof buf, "%s: element %zu is %g, the CPU's %g%s", o.label.c_str(), at, double(o.gpu[at]), double(o.cpu[at]),
                      nan ? " (NaN: an element the kernel never wrote?)" : "");
        if (c.failure.empty()) c.failure = buf;
      }
    }
  } catch (const std::exception& e) {
    c.ok = false;
    c.failure = e.what();
    c.error = INFINITY;
  }
  std::set<std::string> names;
  try {
    for (const KernelTime& k : gpu_.take_profile()) names.insert(k.name);
  } catch (const std::exception& e) {
    c.ok = false;
    if (c.failure.empty()) c.failure = e.what();
  }
  gpu_.set_profiling(false);
  c.kernels.assign(names.begin(), names.end());
  print(c);
  results_.push_back(std::move(c));
}

void DoctorChecks::run_all(const std::vector<std::string>& only) {
  auto wanted = [&](const char* s) { return only.empty() || std::find(only.begin(), only.end(), s) != only.end(); };
  if (wanted("op"))
    for (DType t : {DType::F32, DType::BF16}) gemm_ops(t), ops(t);
  if (wanted("optimizer")) optimizers();
  if (wanted("update")) training_updates();
  if (wanted("checkpoint")) checkpoint_round_trip();
}

// The GEMMs: every shape of a training step (forward, and both gradients), and the residual
// projections with their addend.
void DoctorChecks::gemm_ops(DType t) {
  const int64_t C = cfg_.hidden_size, F = cfg_.intermediate_size, BT = B_ * T_;
  const double bound = tol(t);
  Backend &c = cpu_, &g = gpu_;
  std::set<std::tuple<int64_t, int64_t, int64_t, bool, bool>> seen;
  for (const GemmShape& s : training_step_gemms(cfg_, BT)) {
    if (!seen.insert({s.M, s.N, s.K, s.trans_a, s.trans_b}).second) continue;
    check("op", "matmul", t, dims({s.M, s.N, s.K}) + (s.trans_a ? " a^T" : "") + (s.trans_b ? " b^T" : ""), bound, [&] {
      Twin a(c, g, s.M * s.K, t, 1), b(c, g, s.K * s.N, t, 2), o(c, g, s.M * s.N, t);
      c.matmul(o.c(), a.c(), b.c(), s.M, s.N, s.K, s.trans_a, s.trans_b, false);
      g.matmul(o.g(), a.g(), b.g(), s.M, s.N, s.K, s.trans_a, s.trans_b, false);
      return std::vector<Output>{{"out", o.host(g, o.g().ptr), o.host(c, o.c().ptr)}};
    });
  }
  // The residual projections (o and down: out = residual + x W^T), the residual read as the GEMM's addend
  for (const int64_t K : {C, F})
    check("op", "matmul_residual", t, dims({BT, C, K}), bound, [&] {
      Twin x(c, g, BT * K, t, 1), w(c, g, C * K, t, 2), r(c, g, BT * C, t, 3), o(c, g, BT * C, t);
      c.matmul_residual(o.c(), r.c(), x.c(), w.c(), BT, C, K, false, true);
      g.matmul_residual(o.g(), r.g(), x.g(), w.g(), BT, C, K, false, true);
      return std::vector<Output>{{"out", o.host(g, o.g().ptr), o.host(c, o.c().ptr)}};
    });
}

void DoctorChecks::ops(DType t) {
  const int64_t C = cfg_.hidden_size, F = cfg_.intermediate_size, H = cfg_.num_attention_heads, D = cfg_.head_dim(), V = cfg_.vocab_size;
  const int64_t B = B_, T = T_, BT = B * T;
  const double bound = tol(t);
  Backend &c = cpu_, &g = gpu_;

  std::vector<int32_t> ids(BT);
  for (int64_t i = 0; i < BT; ++i) ids[i] = static_cast<int32_t>((i * 7919 + 11) % V);
  ids[BT - 1] = static_cast<int32_t>(V - 1);
  Ids tok(c, g, ids);
  check("op", "embedding_forward", t, dims({BT, C}), 0.0, [&] {
    Twin w(c, g, V * C, t, 3), o(c, g, BT * C, t);
    c.embedding_forward(o.c(), tok.c(), w.c(), BT, C);
    g.embedding_forward(o.g(), tok.g(), w.g(), BT, C);
    return std::vector<Output>{{"out", o.host(g, o.g().ptr), o.host(c, o.c().ptr)}};
  });
  check("op", "embedding_backward", t, dims({BT, C}), bound, [&] {
    Twin d(c, g, BT * C, t, 4), dw(c, g, V * C, t);
    c.embedding_backward(dw.c(), d.c(), tok.c(), BT, C);
    g.embedding_backward(dw.g(), d.g(), tok.g(), BT, C);
    return std::vector<Output>{{"dwte", dw.host(g, dw.g().ptr), dw.host(c, dw.c().ptr)}};
  });
  check("op", "rmsnorm_forward_backward", t, dims({BT, C}), bound, [&] {
    Twin x(c, g, BT * C, t, 5), w(c, g, C, t, 6), o(c, g, BT * C, t), r(c, g, BT, DType::F32);
    Twin dout(c, g, BT * C, DType::F32, 7), dx(c, g, BT * C, DType::F32), dx_copy(c, g, BT * C, t), dw(c, g, C, t);
    c.rmsnorm_forward(o.c(), r.cf(), x.c(), w.c(), BT, C, 1e-6f);
    g.rmsnorm_forward(o.g(), r.gf(), x.g(), w.g(), BT, C, 1e-6f);
    c.rmsnorm_backward(dx.cf(), dx_copy.c(), dw.c(), dout.cf(), x.c(), w.c(), r.cf(), BT, C, false);
    g.rmsnorm_backward(dx.gf(), dx_copy.g(), dw.g(), dout.gf(), x.g(), w.g(), r.gf(), BT, C, false);
    // dx and dw: FP32 sums over a row and over BT rows, in another order: 1e-4 (as the large-shape tests);
    // dx's copy in the activation dtype (the next projection's operand): dx's bound and its rounding
    return std::vector<Output>{{"out", o.host(g, o.g().ptr), o.host(c, o.c().ptr)},
                               {"rstd", r.host(g, r.g().ptr), r.host(c, r.c().ptr), kF32},
                               {"dx", dx.host(g, dx.g().ptr), dx.host(c, dx.c().ptr), std::max(1e-4, bound)},
                               {"dx_copy", dx_copy.host(g, dx_copy.g().ptr), dx_copy.host(c, dx_copy.c().ptr), std::max(1e-4, bound)},
                               {"dw", dw.host(g, dw.g().ptr), dw.host(c, dw.c().ptr), std::max(1e-4, bound)}};
  });
  std::vector<float> cs(T * D);
  for (int64_t p = 0; p < T; ++p)
    for (int64_t i = 0; i < D / 2; ++i) {
      const double a = p * std::pow(cfg_.rope_theta, -2.0 * i / D);
      cs[(p * D / 2 + i) * 2] = float(std::cos(a)), cs[(p * D / 2 + i) * 2 + 1] = float(std::sin(a));
    }
  check("op", "rope_forward_backward", t, dims({B, T, H, D}), bound, [&] {
    Twin table(c, g, T * D, DType::F32), q(c, g, BT * 3 * C, t, 8);
    c.to_device(table.cf(), cs.data(), T * D * 4), g.to_device(table.gf(), cs.data(), T * D * 4);
    c.rope_forward(q.c(), table.cf(), B, T, H, D);
    g.rope_forward(q.g(), table.gf(), B, T, H, D);
    std::vector<Output> out{{"rotated", q.host(g, q.g().ptr), q.host(c, q.c().ptr)}};
    c.rope_backward(q.c(), table.cf(), B, T, H, D);
    g.rope_backward(q.g(), table.gf(), B, T, H, D);
    out.push_back({"rotated back", q.host(g, q.g().ptr), q.host(c, q.c().ptr)});
    return out;
  });
  check("op", "attention_forward_backward", t, dims({B, T, H, D}), bound, [&] {
    Twin q(c, g, BT * 3 * C, t, 9), o(c, g, BT * C, t), lse(c, g, B * H * T, DType::F32), dout(c, g, BT * C, t, 10), dq(c, g, BT * 3 * C, t);
    c.attention_forward(o.c(), lse.cf(), q.c(), B, T, H, D);
    g.attention_forward(o.g(), lse.gf(), q.g(), B, T, H, D);
    std::vector<Output> out{{"out", o.host(g, o.g().ptr), o.host(c, o.c().ptr)}, {"lse", lse.host(g, lse.g().ptr), lse.host(c, lse.c().ptr)}};
    // The backward pass from the same forward results on both (the CPU's).
    const std::vector<float> oc = o.host(c, o.c().ptr), lc = lse.host(c, lse.c().ptr);
    if (t == DType::F32) {
      g.to_device(o.g().ptr, oc.data(), BT * C * 4);
    } else {
      std::vector<bf16> h(oc.size());
      for (size_t i = 0; i < h.size(); ++i) h[i] = to_bf16(oc[i]);
      g.to_device(o.g().ptr, h.data(), BT * C * 2);
    }
    g.to_device(lse.gf(), lc.data(), B * H * T * 4);
    c.attention_backward(dq.c(), dout.c(), q.c(), o.c(), lse.cf(), B, T, H, D);
    g.attention_backward(dq.g(), dout.g(), q.g(), o.g(), lse.gf(), B, T, H, D);
    out.push_back({"dqkv", dq.host(g, dq.g().ptr), dq.host(c, dq.c().ptr)});
    return out;
  });
  check("op", "attention_decode", t, dims({T, H, D}), bound, [&] {
    Twin kc(c, g, T * C, t), vc(c, g, T * C, t), o(c, g, C, t);
    std::vector<Output> out;
    for (int64_t pos = 0; pos < std::min<int64_t>(T, 40); ++pos) {
      Twin q(c, g, 3 * C, t, 100 + static_cast<uint32_t>(pos));
      c.attention_decode(o.c(), q.c(), kc.c(), vc.c(), pos, H, D);
      g.attention_decode(o.g(), q.g(), kc.g(), vc.g(), pos, H, D);
    }
    out.push_back({"out", o.host(g, o.g().ptr), o.host(c, o.c().ptr)});
    return out;
  });
  check("op", "swiglu_forward_backward", t, dims({BT, F}), bound, [&] {
    Twin gu(c, g, BT * 2 * F, t, 11, 2.0f), o(c, g, BT * F, t), d(c, g, BT * F, t, 12), dgu(c, g, BT * 2 * F, t);
    c.swiglu_forward(o.c(), gu.c(), BT, F);
    g.swiglu_forward(o.g(), gu.g(), BT, F);
    c.swiglu_backward(dgu.c(), Buf{nullptr, t}, d.c(), gu.c(), BT, F);
    g.swiglu_backward(dgu.g(), Buf{nullptr, t}, d.g(), gu.g(), BT, F);
    return std::vector<Output>{{"out", o.host(g, o.g().ptr), o.host(c, o.c().ptr)}, {"dgate_up", dgu.host(g, dgu.g().ptr), dgu.host(c, dgu.c().ptr)}};
  });
  check("op", "cross_entropy", t, dims({BT, V}), bound, [&] {
    Twin logits(c, g, BT * V, DType::F32, 13, 4.0f), loss(c, g, BT, DType::F32), dl(c, g, BT * V, t);
    c.cross_entropy(loss.cf(), dl.c(), logits.cf(), tok.c(), nullptr, BT, V, 1.0f / static_cast<float>(BT));
    g.cross_entropy(loss.gf(), dl.g(), logits.gf(), tok.g(), nullptr, BT, V, 1.0f / static_cast<float>(BT));
    return std::vector<Output>{{"losses", loss.host(g, loss.g().ptr), loss.host(c, loss.c().ptr)}, {"dlogits", dl.host(g, dl.g().ptr), dl.host(c, dl.c().ptr)}};
  });
  check("op", "linear_cross_entropy", t, dims({BT, V, C}), bound, [&] {
    Twin x(c, g, BT * C, t, 14), w(c, g, V * C, t, 15, 0.1f), logits(c, g, BT * V, DType::F32), loss(c, g, BT, DType::F32), dl(c, g, BT * V, t);
    c.linear_cross_entropy(loss.cf(), dl.c(), logits.c(), x.c(), w.c(), tok.c(), nullptr, BT, V, C, 1.0f);
    g.linear_cross_entropy(loss.gf(), dl.g(), logits.g(), x.g(), w.g(), tok.g(), nullptr, BT, V, C, 1.0f);
    return std::vector<Output>{{"losses", loss.host(g, loss.g().ptr), loss.host(c, loss.c().ptr)}, {"dlogits", dl.host(g, dl.g().ptr), dl.host(c, dl.c().ptr)}};
  });
  const int64_t n = BT * C;
  check("op", "sum_squares_scale_convert", t, dims({n}), bound, [&] {
    Twin x(c, g, n, t, 16), f(c, g, n, DType::F32, 17), y(c, g, n, t);
    const double sc = c.optimizer_kernels().sum_squares(x.c(), n), sg = g.optimizer_kernels().sum_squares(x.g(), n);
    // An update's statistics where the gradients are (norm, clip factor), then the clipping that
    // reads the factor there: half the norm, so the factor is 1/2.
    // (Zero-filled: no spike threshold and no loss, which is finite.)
    auto* stc = static_cast<UpdateScalars*>(c.allocate(sizeof(UpdateScalars) + sizeof(LossTotals) + 8));
    auto* stg = static_cast<UpdateScalars*>(g.allocate(sizeof(UpdateScalars) + sizeof(LossTotals) + 8));
    auto* ltc = reinterpret_cast<LossTotals*>(stc + 1);
    auto* ltg = reinterpret_cast<LossTotals*>(stg + 1);
    auto* sqc = reinterpret_cast<double*>(ltc + 1);
    auto* sqg = reinterpret_cast<double*>(ltg + 1);
    const Buf xc = x.c(), xg = x.g();
    c.optimizer_kernels().sum_squares_many(&xc, &n, 1, sqc), g.optimizer_kernels().sum_squares_many(&xg, &n, 1, sqg);
    c.optimizer_kernels().update_statistics(stc, ltc, sqc, 1, 0.5 * std::sqrt(sc)), g.optimizer_kernels().update_statistics(stg, ltg, sqg, 1, 0.5 * std::sqrt(sc));
    UpdateStatistics hc, hg;
    c.to_host(&hc, &stc->stats, sizeof hc), g.to_host(&hg, &stg->stats, sizeof hg);
    c.optimizer_kernels().clip_gradients(x.c(), n, stc), g.optimizer_kernels().clip_gradients(x.g(), n, stg);
    c.release(stc), g.release(stg);
    c.optimizer_kernels().scale(x.c(), n, 0.5f), g.optimizer_kernels().scale(x.g(), n, 0.5f);
    c.convert(y.c(), f.c(), n), g.convert(y.g(), f.g(), n);
    return std::vector<Output>{{"sum of squares", {float(sg)}, {float(sc)}},
                               {"update statistics: norm, clip factor", {float(hg.grad_norm), hg.clip_factor}, {float(hc.grad_norm), hc.clip_factor}},
                               {"clipped and scaled", x.host(g, x.g().ptr), x.host(c, x.c().ptr)},
                               {"converted", y.host(g, y.g().ptr), y.host(c, y.c().ptr)}};
  });
}

void DoctorChecks::optimizers() {
  const DType t = DType::BF16;  // the paper's BF16 weights and gradients
  Backend &c = cpu_, &g = gpu_;
  std::set<std::pair<int64_t, int64_t>> shapes;
  for (const TensorSpec& s : llama_parameters(cfg_))
    if (s.group() == TensorGroup::Attention || s.group() == TensorGroup::Mlp) shapes.insert({s.rows(), s.cols()});
  for (const auto& [m, n] : shapes) {
    check("optimizer", "sinkgd", t, dims({m, n}), kBf16, [&, m = m, n = n] {
      Twin w(c, g, m * n, t, 20, 0.05f), gr(c, g, m * n, t, 21);
      SinkGDArgs a;
      a.lr = 1e-3f;
      c.optimizer_kernels().sinkgd_update(w.c(), gr.c(), m, n, a), g.optimizer_kernels().sinkgd_update(w.g(), gr.g(), m, n, a);
      return std::vector<Output>{{"w", w.host(g, w.g().ptr), w.host(c, w.c().ptr)}};
    });
    check("optimizer", "swan", t, dims({m, n}), kBf16, [&, m = m, n = n] {
      Twin w(c, g, m * n, t, 22, 0.05f), gr(c, g, m * n, t, 23);
      SwanArgs a;
      a.lr = 1e-3f;
      c.optimizer_kernels().swan_update(w.c(), gr.c(), m, n, a), g.optimizer_kernels().swan_update(w.g(), gr.g(), m, n, a);
      return std::vector<Output>{{"w", w.host(g, w.g().ptr), w.host(c, w.c().ptr)}};
    });
  }
  // Many matrices in one call: one layer's (what the optimizer groups).
  std::vector<TensorSpec> layer;
  for (const TensorSpec& s : llama_parameters(cfg_))
    if (s.layer == 0 && (s.group() == TensorGroup::Attention || s.group() == TensorGroup::Mlp)) layer.push_back(s);
  check("optimizer", "sinkgd_many", t, std::to_string(layer.size()) + " matrices", kBf16, [&] {
    std::vector<std::unique_ptr<Twin>> ws, gs;
    std::vector<SinkGDTensor> tc, tg;
    for (size_t k = 0; k < layer.size(); ++k) {
      const int64_t m = layer[k].rows(), n = layer[k].cols();
      ws.push_back(std::make_unique<Twin>(c, g, m * n, t, 30 + static_cast<uint32_t>(k), 0.05f));
      gs.push_back(std::make_unique<Twin>(c, g, m * n, t, 60 + static_cast<uint32_t>(k)));
      tc.push_back({ws.back()->c(), gs.back()->c(), m, n, k}), tg.push_back({ws.back()->g(), gs.back()->g(), m, n, k});
    }
    SinkGDArgs a;
    a.lr = 1e-3f;
    c.optimizer_kernels().sinkgd_update_many(tc.data(), static_cast<int64_t>(tc.size()), a), g.optimizer_kernels().sinkgd_update_many(tg.data(), static_cast<int64_t>(tg.size()), a);
    std::vector<Output> out;
    for (size_t k = 0; k < layer.size(); ++k) out.push_back({layer[k].name, ws[k]->host(g, ws[k]->g().ptr), ws[k]->host(c, ws[k]->c().ptr)});
    return out;
  });
  const int64_t n = cfg_.vocab_size * cfg_.hidden_size;  // the embedding
  check("optimizer", "adam", t, dims({cfg_.vocab_size, cfg_.hidden_size}), kBf16, [&] {
    Twin w(c, g, n, t, 24, 0.05f), gr(c, g, n, t, 25), m(c, g, n, DType::F32), v(c, g, n, DType::F32);
    AdamArgs a;
    a.lr = 1e-3f, a.decoupled_decay = 0.1f;
    c.optimizer_kernels().adam_update(w.c(), gr.c(), m.c(), v.c(), n, a), g.optimizer_kernels().adam_update(w.g(), gr.g(), m.g(), v.g(), n, a);
    return std::vector<Output>{{"w", w.host(g, w.g().ptr), w.host(c, w.c().ptr)}, {"v", v.host(g, v.g().ptr), v.host(c, v.c().ptr)}};
  });
  check("optimizer", "sgd", t, dims({cfg_.vocab_size, cfg_.hidden_size}), kBf16, [&] {
    Twin w(c, g, n, t, 26, 0.05f), gr(c, g, n, t, 27), buf(c, g, n, t, 28);
    SgdArgs a;
    a.lr = 1e-3f, a.momentum = 0.9f;
    c.optimizer_kernels().sgd_update(w.c(), gr.c(), buf.c(), n, a), g.optimizer_kernels().sgd_update(w.g(), gr.g(), buf.g(), n, a);
    return std::vector<Output>{{"w", w.host(g, w.g().ptr), w.host(c, w.c().ptr)}, {"momentum", buf.host(g, buf.g().ptr), buf.host(c, buf.c().ptr)}};
  });
  const int64_t norms = 2 * cfg_.num_hidden_layers + 1, C = cfg_.hidden_size;
  check("optimizer", "adam_many", t, std::to_string(norms) + " x " + std::to_string(C), kBf16, [&] {
    std::vector<std::unique_ptr<Twin>> bufs;
    std::vector<AdamTensor> tc, tg;
    for (int64_t k = 0; k < norms; ++k) {
      for (int j = 0; j < 4; ++j)
        bufs.push_back(std::make_unique<Twin>(c, g, C, j < 2 ? t : DType::F32, j < 2 ? static_cast<uint32_t>(200 + 2 * k + j) : 0, j == 0 ? 1.0f : 0.1f));
      const size_t b = bufs.size() - 4;
      tc.push_back({bufs[b]->c(), bufs[b + 1]->c(), bufs[b + 2]->c(), bufs[b + 3]->c(), C, static_cast<uint64_t>(k)});
      tg.push_back({bufs[b]->g(), bufs[b + 1]->g(), bufs[b + 2]->g(), bufs[b + 3]->g(), C, static_cast<uint64_t>(k)});
    }
    AdamArgs a;
    a.lr = 1e-3f;
    c.optimizer_kernels().adam_update_many(tc.data(), norms, a), g.optimizer_kernels().adam_update_many(tg.data(), norms, a);
    std::vector<Output> out;
    for (int64_t k = 0; k < norms; ++k) out.push_back({"norm " + std::to_string(k), bufs[4 * k]->host(g, bufs[4 * k]->g().ptr), bufs[4 * k]->host(c, bufs[4 * k]->c().ptr)});
    return out;
  });
}

namespace {
// The reduced model of the update and checkpoint checks: the model's widths, at most two layers.
ModelConfig reduced(const ModelConfig& m) {
  ModelConfig r = m;
  r.num_hidden_layers = std::min<int64_t>(2, m.num_hidden_layers);
  return r;
}
}  // namespace

RunConfig doctor_run(const ModelConfig& m, const std::string& optimizer, const std::string& precision, int64_t B, int64_t T) {
  json model = {{"vocab_size", m.vocab_size},
                {"hidden_size", m.hidden_size},
                {"intermediate_size", m.intermediate_size},
                {"num_hidden_layers", m.num_hidden_layers},
                {"num_attention_heads", m.num_attention_heads},
                {"max_position_embeddings", m.max_position_embeddings},
                {"tie_word_embeddings", m.tie_word_embeddings}};
  json doc = {{"model", {{"config", model}}},
              {"batch", {{"global_batch", B}, {"micro_batch", B}, {"seq_len", T}}},
              {"schedule", {{"kind", "constant"}, {"total_steps", 1000000}, {"warmup_steps", 0}}},
              {"precision", {{"params", precision}, {"optimizer_states", precision}}},
              {"optimizer", {{"name", optimizer}, {"momentum", 0.9}, {"grad_clip", 0.5}}}};
  return run_config_from_json(doc, "doctor");
}

void DoctorChecks::training_updates() {
  const ModelConfig m = reduced(cfg_);
  const int64_t B = B_, T = T_;
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int64_t i = 0; i < B * T; ++i) tokens[i] = static_cast<int32_t>((i * 104729 + 7) % m.vocab_size), targets[i] = tokens[(i + 3) % (B * T)];
  const MicroBatch mb{tokens.data(), targets.data(), nullptr, B, T};
  for (const char* name : {"sinkgd", "swan", "adam", "adamw", "sgd"}) {
    check("update", std::string("two updates, ") + name, DType::F32, std::to_string(m.num_hidden_layers) + " layers", 5e-2, [&] {
      const RunConfig run = doctor_run(m, name, "fp32", B, T);
      LlamaModel mc(cpu_, run.model, DType::F32, B, T), mg(gpu_, run.model, DType::F32, B, T);
      mc.init_random(4);
      mg.params_from_host(mc.params_to_host());
      Optimizer oc(mc.store(), run), og(mg.store(), run);
      // The GPU as a run drives it: each update queued with no host wait, the second one captured as
      // a graph and replayed (every rule's, SWAN's included).
      og.set_graphs(true);
      for (int64_t update = 1; update <= 2; ++update) {
        mc.zero_grads(), mg.zero_grads();
        mc.queue_forward_backward(mb, 0.5f), mg.queue_forward_backward(mb, 0.5f);
        oc.step(update, update);
        og.queue_step(update, update);
        og.wait_for_step();
      }
      const std::vector<float> pc = mc.params_to_host(), pg = mg.params_to_host();
      std::vector<Output> out;
      // Per tensor, at its rule's bound (the file's header).
      for (const ParamAssignment& as : oc.assignments()) {
        const TensorSpec& ts = *as.tensor;
        const bool adam = as.optimizer == OptimizerKind::Adam || as.optimizer == OptimizerKind::AdamW;
        const double rule = adam ? 5e-2 : as.optimizer == OptimizerKind::Swan ? 3e-3 : 1e-4;
        out.push_back({ts.name + " (" + choice_name(as.optimizer) + ")", std::vector<float>(pg.begin() + ts.offset, pg.begin() + ts.offset + ts.numel()),
                       std::vector<float>(pc.begin() + ts.offset, pc.begin() + ts.offset + ts.numel()), rule});
      }
      return out;
    });
  }
}

void DoctorChecks::checkpoint_round_trip() {
  const ModelConfig m = reduced(cfg_);
  const int64_t B = B_, T = T_;
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int64_t i = 0; i < B * T; ++i) tokens[i] = static_cast<int32_t>((i * 31 + 5) % m.vocab_size), targets[i] = tokens[(i + 1) % (B * T)];
  const MicroBatch mb{tokens.data(), targets.data(), nullptr, B, T};
  char dir_template[] = "/tmp/multinorm-doctor-XXXXXX";
  const char* tmp = ::mkdtemp(dir_template);
  if (!tmp) throw Error("doctor: cannot create a temporary directory under /tmp");
  const std::string root = tmp;
  for (int direction = 0; direction < 2; ++direction) {
    Backend& from = direction == 0 ? gpu_ : cpu_;
    Backend& to = direction == 0 ? cpu_ : gpu_;
    const std::string name = direction == 0 ? "cuda -> cpu" : "cpu -> cuda";
    check("checkpoint", "round trip " + name, DType::BF16, "adam, " + std::to_string(m.num_hidden_layers) + " layers", 0.0, [&] {
      const RunConfig run = doctor_run(m, "adam", "bf16", B, T);
      LlamaModel a(from, run.model, DType::BF16, B, T), b(to, run.model, DType::BF16, B, T);
      a.init_random(9);
      Optimizer oa(a.store(), run), ob(b.store(), run);
      a.zero_grads();
      a.forward_backward(mb, 0.5f);
      oa.step(1, 1);
      TrainerState state;
      state.step = 1;
      state.fingerprint = config_fingerprint(run);
      const std::string run_dir = root + "/" + std::to_string(direction);
      std::filesystem::create_directories(run_dir + "/checkpoints");
      const std::string ckpt = write_checkpoint(run_dir, a.store(), oa.states_to_host(), state, 1, run);
      read_checkpoint(ckpt, b.store(), &ob, run);
      const std::vector<uint8_t> sa = oa.states_to_host(), sb = ob.states_to_host();
      std::vector<float> fa(sa.size()), fb(sb.size());  // bytes as values: bit-exact comparison
      for (size_t i = 0; i < sa.size(); ++i) fa[i] = sa[i];
      for (size_t i = 0; i < sb.size(); ++i) fb[i] = sb[i];
      return std::vector<Output>{{"weights", b.params_to_host(), a.params_to_host()}, {"optimizer state bytes", fb, fa}};
    });
  }
  std::error_code ignored;
  std::filesystem::remove_all(root, ignored);
}

}  // namespace multinorm
