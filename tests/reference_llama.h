// An independent FP64 reference of the LLaMA forward pass, written for clarity, not speed: full
// score matrices with an explicit causal mask, per-head loops, no fusion, no shared code with the
// kernels. Used for finite differences and to check the CPU backend's forward and backward.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "multinorm/model_spec.h"

namespace multinorm::reference {

using Vec = std::vector<double>;

// y[N,C] = rmsnorm(x) * w
inline Vec rmsnorm(const Vec& x, const double* w, int64_t N, int64_t C, double eps) {
  Vec y(N * C);
  for (int64_t i = 0; i < N; ++i) {
    double ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += x[i * C + c] * x[i * C + c];
    const double r = 1.0 / std::sqrt(ms / C + eps);
    for (int64_t c = 0; c < C; ++c) y[i * C + c] = x[i * C + c] * r * w[c];
  }
  return y;
}

// y[N,O] = x[N,I] W^T, W [O,I]
inline Vec linear(const Vec& x, const double* W, int64_t N, int64_t I, int64_t O) {
  Vec y(N * O, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) {
      double s = 0;
      for (int64_t i = 0; i < I; ++i) s += x[n * I + i] * W[o * I + i];
      y[n * O + o] = s;
    }
  return y;
}

// Rotate-half RoPE of one head vector at position p (HF's q*cos + rotate_half(q)*sin).
inline void rope(double* x, int64_t D, int64_t p, double theta) {
  const int64_t h = D / 2;
  std::vector<double> out(D);
  for (int64_t i = 0; i < D; ++i) {
    const int64_t k = i % h;
    const double angle = p * std::pow(theta, -2.0 * k / D);
    const double rot = i < h ? -x[i + h] : x[i - h];
    out[i] = x[i] * std::cos(angle) + rot * std::sin(angle);
  }
  for (int64_t i = 0; i < D; ++i) x[i] = out[i];
}

// Causal attention: q, k, v [B,T,H,D] -> out [B,T,H*D]
inline Vec attention(const Vec& q, const Vec& k, const Vec& v, int64_t B, int64_t T, int64_t H, int64_t D) {
  Vec out(B * T * H * D, 0.0);
  std::vector<double> s(T * T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      auto at = [&](const Vec& x, int64_t t, int64_t d) { return x[((b * T + t) * H + h) * D + d]; };
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < T; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += at(q, i, d) * at(k, j, d);
          s[i * T + j] = j <= i ? dot / std::sqrt(static_cast<double>(D)) : -INFINITY;
        }
      for (int64_t i = 0; i < T; ++i) {
        double m = -INFINITY, z = 0;
        for (int64_t j = 0; j < T; ++j) m = std::max(m, s[i * T + j]);
        for (int64_t j = 0; j < T; ++j) z += std::exp(s[i * T + j] - m);
        for (int64_t j = 0; j < T; ++j) {
          const double p = std::exp(s[i * T + j] - m) / z;
          for (int64_t d = 0; d < D; ++d) out[((b * T + i) * H + h) * D + d] += p * at(v, j, d);
        }
      }
    }
  return out;
}

// Per-position cross-entropy of logits [N,V]
inline double cross_entropy(const double* logits, int64_t V, int32_t target) {
  double m = -INFINITY, z = 0;
  for (int64_t v = 0; v < V; ++v) m = std::max(m, logits[v]);
  for (int64_t v = 0; v < V; ++v) z += std::exp(logits[v] - m);
  return std::log(z) + m - logits[target];
}

// Sum of per-position losses over unmasked positions; params in arena order (llama_parameters).
inline double loss_sum(const ModelConfig& cfg, const Vec& params, const std::vector<int32_t>& tokens,
                       const std::vector<int32_t>& targets, const std::vector<uint8_t>& mask, int64_t B, int64_t T,
                       std::vector<double>* logits_out = nullptr) {
  const auto specs = llama_parameters(cfg);
  auto W = [&](const std::string& name) {
    for (const auto& s : specs)
      if (s.name == name) return params.data() + s.offset;
    return static_cast<const double*>(nullptr);
  };
  const int64_t C = cfg.hidden_size, F = cfg.intermediate_size, H = cfg.num_attention_heads, D = C / H,
                V = cfg.vocab_size, N = B * T;
  Vec x(N * C);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) x[n * C + c] = W("model.embed_tokens.weight")[tokens[n] * C + c];
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const Vec h1 = rmsnorm(x, W(p + "input_layernorm.weight"), N, C, cfg.rms_norm_eps);
    Vec q = linear(h1, W(p + "self_attn.q_proj.weight"), N, C, C);
    Vec k = linear(h1, W(p + "self_attn.k_proj.weight"), N, C, C);
    const Vec v = linear(h1, W(p + "self_attn.v_proj.weight"), N, C, C);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h) {
        rope(&q[n * C + h * D], D, n % T, cfg.rope_theta);
        rope(&k[n * C + h * D], D, n % T, cfg.rope_theta);
      }
    const Vec att = attention(q, k, v, B, T, H, D);
    const Vec o = linear(att, W(p + "self_attn.o_proj.weight"), N, C, C);
    for (int64_t i = 0; i < N * C; ++i) x[i] += o[i];
    const Vec h2 = rmsnorm(x, W(p + "post_attention_layernorm.weight"), N, C, cfg.rms_norm_eps);
    const Vec g = linear(h2, W(p + "mlp.gate_proj.weight"), N, C, F);
    const Vec u = linear(h2, W(p + "mlp.up_proj.weight"), N, C, F);
    Vec s(N * F);
    for (int64_t i = 0; i < N * F; ++i) s[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    const Vec dn = linear(s, W(p + "mlp.down_proj.weight"), N, F, C);
    for (int64_t i = 0; i < N * C; ++i) x[i] += dn[i];
  }
  const Vec hf = rmsnorm(x, W("model.norm.weight"), N, C, cfg.rms_norm_eps);
  const Vec logits = linear(hf, W(cfg.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"), N, C, V);
  if (logits_out) *logits_out = logits;
  double sum = 0;
  for (int64_t n = 0; n < N; ++n)
    if (mask.empty() || mask[n]) sum += cross_entropy(&logits[n * V], V, targets[n]);
  return sum;
}

}  // namespace multinorm::reference
