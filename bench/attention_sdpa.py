"""PyTorch's causal attention on the shapes of `multinorm bench attention`, in TFLOP/s counted the same way.

    python3 bench/attention_sdpa.py --device cuda --shapes 64x32x256x64,16x32x1024x64 --steps 20

Each shape is BATCHxHEADSxSEQxHEAD_DIM. It times torch.nn.functional.scaled_dot_product_attention
(is_causal=True) on q, k, v of [B, H, T, D] in BF16, forward and forward + backward, with whatever
kernel PyTorch picks there, and, on CUDA, with its FlashAttention-2 kernel forced where that one is
available (FlashAttention-2 is the reference issue 47's targets name). FLOPs as FlashAttention counts
them and as multinorm's bench does: 4 x B x H x D x T(T+1)/2 forward, 2.5x that backward. Where
PyTorch has no scaled_dot_product_attention (before 2.0: the CPU PyTorch of the build machines), the
softmax written out is timed instead, and the line says so. One JSON line per shape and kernel, then
a summary line.
"""
import argparse
import contextlib
import json
import math
import time

import torch
import torch.nn.functional as F


def forward_flops(B, H, T, D):
    return 4.0 * B * H * D * T * (T + 1) / 2.0


def written_out(q, k, v):
    """Causal softmax attention without SDPA (FP32 softmax), for PyTorch older than 2.0."""
    T = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


def kernels(device):
    """(name, context manager factory, attention function) of what is timed on this device."""
    if not hasattr(F, "scaled_dot_product_attention"):
        return [("written out (no scaled_dot_product_attention in PyTorch %s)" % torch.__version__, contextlib.nullcontext, written_out)]
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = [("sdpa (PyTorch's choice)", contextlib.nullcontext, sdpa)]
    if device.type == "cuda":
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            out.append(("sdpa flash_attention", lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION), sdpa))
        except ImportError:
            pass
    return out


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_call(fn, steps, device):
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / steps


def time_shape(B, H, T, D, device, dtype, steps, warmup, name, context, attend):
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, T, D, generator=gen).to(device=device, dtype=dtype).requires_grad_() for _ in range(3))
    dout = torch.randn(B, H, T, D, generator=gen).to(device=device, dtype=dtype)

    def forward():
        with torch.no_grad():
            attend(q, k, v)

    def forward_backward():
        out = attend(q, k, v)
        q.grad = k.grad = v.grad = None
        out.backward(dout)

    with context():
        for _ in range(warmup):
            forward_backward()
        fwd_s = seconds_per_call(forward, steps, device)
        fb_s = seconds_per_call(forward_backward, steps, device)
    f = forward_flops(B, H, T, D)
    return {"batch": B, "heads": H, "seq": T, "head_dim": D, "kernel": name, "forward_s": fwd_s, "forward_backward_s": fb_s,
            "forward_tflops": f / fwd_s / 1e12, "forward_backward_tflops": 3.5 * f / fb_s / 1e12}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", required=True, help="comma-separated BATCHxHEADSxSEQxHEAD_DIM")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    device = torch.device(a.device)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    rows, errors = [], []
    for shape in a.shapes.split(","):
        B, H, T, D = (int(x) for x in shape.lower().split("x"))
        for name, context, attend in kernels(device):
            try:
                row = time_shape(B, H, T, D, device, dtype, a.steps, a.warmup, name, context, attend)
            except Exception as e:  # a kernel PyTorch refuses for this shape or device is reported, not fatal
                row = {"batch": B, "heads": H, "seq": T, "head_dim": D, "kernel": name, "error": f"{type(e).__name__}: {e}"[:1000]}
                errors.append(row)
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = {"torch": torch.__version__, "device": str(device), "dtype": a.dtype, "rows": len(rows), "errors": len(errors),
               "flops": "causal: 4 B H D T(T+1)/2 forward, 2.5x that backward (FlashAttention's convention)"}
    if device.type == "cuda" and torch.cuda.is_available():
        summary["device_name"] = torch.cuda.get_device_name(device)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
