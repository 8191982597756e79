"""The paper's LLaMA in plain PyTorch (autograd), written independently of multinorm's C++ code.

Used as the baseline of `multinorm bench model`, by tests/torch_crosscheck.py and by
scripts/gpu_check.sh. Semantics follow Hugging Face's LlamaForCausalLM: pre-norm RMSNorm (variance
in FP32), rotate-half RoPE, causal softmax attention scaled by 1/sqrt(head_dim), SwiGLU MLP, untied
(or tied) lm_head, no biases.

    python3 bench/torch_llama.py --config configs/models/llama_tiny.json --batch 16 --seq 256
prints one JSON line with tokens/s of a forward+backward step in fp32 and bf16 autocast (the CPU).

    python3 bench/torch_llama.py --config configs/models/llama_1b.json --batch 32 --seq 256 --device cuda
times the modes bf16_sdpa (weights and activations in BF16, attention by
torch.nn.functional.scaled_dot_product_attention with is_causal, eager) and bf16_sdpa_compile (the
same with each transformer block under torch.compile: one block's graph, reused by every layer, so
the compile time does not grow with depth; the embedding, final norm, head and loss stay eager); a
mode that fails (torch.compile on a node without a compiler) is
recorded with its error and the others go on. FLOPs per token as multinorm counts them (6 x GEMM
parameters + 12 x L x T x C), so MFU = tokens/s x that / --peak-tflops. --progress prints each mode's
line as it finishes, so a caller that stops the script keeps the modes done.
"""
import argparse
import contextlib
import json
import math
import os
import sys
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


def has_sdpa():
    return hasattr(F, "scaled_dot_product_attention")


class Block(torch.nn.Module):
    def __init__(self, c, attention="manual"):
        super().__init__()
        self.attention = attention  # manual: the softmax written out (FP32); sdpa: scaled_dot_product_attention
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
        if self.attention == "sdpa":
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            s = s.masked_fill(mask, float("-inf"))
            p = torch.softmax(s.float(), dim=-1).to(q.dtype)
            a = p @ v
        a = a.transpose(1, 2).reshape(B, T, C)
        x = x + self.o_proj(a)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(torch.nn.Module):
    def __init__(self, c, max_seq, attention="manual"):
        super().__init__()
        self.cfg = c
        self.embed_tokens = torch.nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = torch.nn.ModuleList([Block(c, attention) for _ in range(c["num_hidden_layers"])])
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


def flops_per_token(c, seq):
    """multinorm's count (model_flops_per_token): 6 x GEMM parameters (the lm_head, or the tied
    embedding used as the head) + 12 x L x T x C for attention, without the causal saving."""
    C, Fd, L, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    gemm = L * (4 * C * C + 3 * C * Fd) + V * C
    return 6.0 * gemm + 12.0 * L * seq * C


MODES = ("fp32", "bf16_autocast", "bf16_sdpa", "bf16_sdpa_compile")


def build(cfg, seq, mode, device):
    """The model of a mode, its weights drawn as the bench always drew them, on the device."""
    torch.manual_seed(0)
    sdpa = mode.startswith("bf16_sdpa") and has_sdpa()
    # On a GPU the weights are made there (torch >= 2.0): llama_1b's 1.3B drawn on the CPU take seconds.
    where = device if device.type != "cpu" and hasattr(torch.device, "__enter__") else contextlib.nullcontext()
    with where:
        model = Llama(cfg, seq, attention="sdpa" if sdpa else "manual")
        for p in model.parameters():
            if p.dim() > 1:
                torch.nn.init.normal_(p, std=cfg.get("initializer_range", 0.02))
    model = model.to(device)
    if mode.startswith("bf16_sdpa"):
        model = model.to(torch.bfloat16)
    if mode == "bf16_sdpa_compile":
        if not hasattr(torch, "compile"):
            raise RuntimeError(f"torch.compile: not in PyTorch {torch.__version__}")
        # Block by block: one graph of the whole model takes a compile time that grows with its depth
        # (llama_1b's might not fit a node's budget); the blocks share one (the same code and shapes).
        try:  # where Dynamo guards on each block's identity, every layer is a recompile: let them all be
            from torch import _dynamo as dynamo  # (an `import torch._dynamo` here would make torch a local name)
            for name in ("cache_size_limit", "recompile_limit"):
                if hasattr(dynamo.config, name):
                    setattr(dynamo.config, name, max(getattr(dynamo.config, name), 2 * len(model.layers)))
        except Exception:
            pass
        for i, blk in enumerate(model.layers):
            if hasattr(blk, "compile"):  # nn.Module.compile (PyTorch >= 2.2): in place, the names unchanged
                blk.compile()
            else:
                model.layers[i] = torch.compile(blk)
    return model


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench(cfg, batch, seq, steps, mode, budget_s=20.0, device=torch.device("cpu"), warmup=1):
    """Tokens/s of forward+backward; stops timing early once budget_s has passed (at least one step)."""
    model = build(cfg, seq, mode, device)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg["vocab_size"], (batch, seq), generator=gen).to(device)
    targets = torch.roll(tokens, -1, dims=1)
    mask = torch.ones(batch, seq, device=device)

    def step():
        model.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=(mode == "bf16_autocast")):
            logits = model(tokens)
        loss = loss_fn(logits, targets, mask)
        loss.backward()

    for _ in range(max(1, warmup)):  # (torch.compile compiles the forward and the backward here)
        step()
    sync(device)
    t0 = time.perf_counter()
    done = 0
    while done < steps and (done == 0 or time.perf_counter() - t0 < budget_s):
        step()
        done += 1
    sync(device)
    return batch * seq * done / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first (torch.compile compiles in the first)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--modes", default="", help=f"comma-separated, of {', '.join(MODES)} "
                    "(default: fp32,bf16_autocast on the CPU; bf16_sdpa,bf16_sdpa_compile on CUDA)")
    ap.add_argument("--budget", type=float, default=20.0, help="seconds of timed steps per mode at most")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="the device's BF16 dense peak: MFU is reported against it")
    ap.add_argument("--progress", action="store_true", help="print each mode's JSON line as it finishes")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    cfg = load_model_config(a.config)
    device = torch.device(a.device)
    modes = [m for m in a.modes.split(",") if m] or (["bf16_sdpa", "bf16_sdpa_compile"] if device.type == "cuda" else ["fp32", "bf16_autocast"])
    for m in modes:
        if m not in MODES:
            ap.error(f"--modes: unknown mode '{m}' (known: {', '.join(MODES)})")
    fpt = flops_per_token(cfg, a.seq)
    r, errors = {}, {}
    for mode in modes:
        try:
            r[mode] = bench(cfg, a.batch, a.seq, a.steps, mode, a.budget, device, a.warmup)
            line = {"mode": mode, "tokens_per_s": r[mode], "tflops": r[mode] * fpt / 1e12}
        except Exception as e:  # a mode that cannot run here (no compiler, out of memory) is reported, not fatal
            errors[mode] = f"{type(e).__name__}: {e}"[:2000]
            line = {"mode": mode, "error": errors[mode]}
        if device.type == "cuda" and torch.cuda.is_available():
            torch.cuda.empty_cache()
        if a.progress:
            print(json.dumps(line), flush=True)
    out = {"tokens_per_s": r, "torch": torch.__version__, "threads": torch.get_num_threads(), "device": str(device),
           "flops_per_token": fpt, "batch": a.batch, "seq": a.seq}
    if r:
        best = max(r, key=r.get)
        out.update(best_mode=best, best_tokens_per_s=r[best])
    if errors:
        out["errors"] = errors
    if "bf16_sdpa_compile" in modes:
        out["compile"] = "torch.compile per transformer block; embedding, final norm, head and loss eager"
    if any(m.startswith("bf16_sdpa") for m in modes):
        out["attention"] = "scaled_dot_product_attention (is_causal)" if has_sdpa() else \
            f"the softmax written out: PyTorch {torch.__version__} has no scaled_dot_product_attention"
    if device.type == "cuda" and torch.cuda.is_available():
        out["device_name"] = torch.cuda.get_device_name(device)
    if a.peak_tflops > 0:
        out["peak_tflops"] = a.peak_tflops
        out["mfu"] = {m: v * fpt / (a.peak_tflops * 1e12) for m, v in r.items()}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
