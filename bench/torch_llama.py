"""The paper's LLaMA in plain PyTorch (autograd), written independently of multinorm's C++ code.

Used as the baseline of `multinorm bench model` and by tests/torch_crosscheck.py. Semantics follow
Hugging Face's LlamaForCausalLM: pre-norm RMSNorm (variance in FP32), rotate-half RoPE, causal
softmax attention scaled by 1/sqrt(head_dim), SwiGLU MLP, untied (or tied) lm_head, no biases.

    python3 bench/torch_llama.py --config configs/models/llama_tiny.json --batch 16 --seq 256
prints one JSON line with tokens/s of a forward+backward step in fp32 and bf16 autocast.
"""
import argparse
import json
import math
import os
import time

import torch
import torch.nn.functional as F


def load_model_config(path):
    with open(path) as f:
        cfg = json.load(f)
    if "hidden_size" in cfg:
        return cfg
    ref = cfg["model"]["config"]
    if isinstance(ref, dict):
        return ref
    with open(os.path.join(os.path.dirname(path), ref)) as f:
        return json.load(f)


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_tables(seq, dim, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2).float() / dim))
    freqs = torch.outer(torch.arange(seq).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        C, Fd = c["hidden_size"], c["intermediate_size"]
        self.heads = c["num_attention_heads"]
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)
        self.input_layernorm = RMSNorm(C, c["rms_norm_eps"])
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = lin(C, C), lin(C, C), lin(C, C), lin(C, C)
        self.post_attention_layernorm = RMSNorm(C, c["rms_norm_eps"])
        self.gate_proj, self.up_proj, self.down_proj = lin(C, Fd), lin(C, Fd), lin(Fd, C)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        H = self.heads
        D = C // H
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, H, D).transpose(1, 2)
        k = self.k_proj(h).view(B, T, H, D).transpose(1, 2)
        v = self.v_proj(h).view(B, T, H, D).transpose(1, 2)
        cos, sin = cos[:T].to(q.dtype), sin[:T].to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        s = s.masked_fill(mask, float("-inf"))
        p = torch.softmax(s.float(), dim=-1).to(q.dtype)
        a = (p @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.o_proj(a)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(torch.nn.Module):
    def __init__(self, c, max_seq):
        super().__init__()
        self.cfg = c
        self.embed_tokens = torch.nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = torch.nn.ModuleList([Block(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.tied = c.get("tie_word_embeddings", False)
        if not self.tied:
            self.lm_head = torch.nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        D = c["hidden_size"] // c["num_attention_heads"]
        cos, sin = rope_tables(max_seq, D, c.get("rope_theta", 10000.0))
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def hf_parameters(self):
        """Parameters under their Hugging Face names."""
        out = {"model.embed_tokens.weight": self.embed_tokens.weight}
        for i, b in enumerate(self.layers):
            p = f"model.layers.{i}."
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out[p + f"self_attn.{n}.weight"] = getattr(b, n).weight
            for n in ("gate_proj", "up_proj", "down_proj"):
                out[p + f"mlp.{n}.weight"] = getattr(b, n).weight
            out[p + "input_layernorm.weight"] = b.input_layernorm.weight
            out[p + "post_attention_layernorm.weight"] = b.post_attention_layernorm.weight
        out["model.norm.weight"] = self.norm.weight
        if not self.tied:
            out["lm_head.weight"] = self.lm_head.weight
        return out

    def forward(self, tokens):
        x = self.embed_tokens(tokens)
        for b in self.layers:
            x = b(x, self.cos, self.sin)
        x = self.norm(x)
        w = self.embed_tokens.weight if self.tied else self.lm_head.weight
        return x @ w.t()


def loss_fn(logits, targets, mask):
    """Mean cross-entropy over positions where mask is 1."""
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1).clamp(min=0), reduction="none")
    m = mask.reshape(-1).float()
    return (ce * m).sum() / m.sum()


def bench(cfg, batch, seq, steps, mode, budget_s=20.0):
    """Tokens/s of forward+backward; stops timing early once budget_s has passed (at least one step)."""
    torch.manual_seed(0)
    model = Llama(cfg, seq)
    for p in model.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=cfg.get("initializer_range", 0.02))
    tokens = torch.randint(0, cfg["vocab_size"], (batch, seq))
    targets = torch.roll(tokens, -1, dims=1)
    mask = torch.ones(batch, seq)

    def step():
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=(mode == "bf16_autocast")):
            logits = model(tokens)
        loss = loss_fn(logits, targets, mask)
        loss.backward()

    step()  # warm-up
    t0 = time.perf_counter()
    done = 0
    while done < steps and (done == 0 or time.perf_counter() - t0 < budget_s):
        step()
        done += 1
    return batch * seq * done / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    cfg = load_model_config(a.config)
    r = {mode: bench(cfg, a.batch, a.seq, a.steps, mode) for mode in ("fp32", "bf16_autocast")}
    best = max(r, key=r.get)
    print(json.dumps({"tokens_per_s": r, "best_mode": best, "best_tokens_per_s": r[best],
                      "torch": torch.__version__, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
