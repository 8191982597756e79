"""PyTorch's causal attention on the shapes of `multinorm bench attention`, in TFLOP/s counted the same way.

    python3 bench/attention_sdpa.py --device cuda --shapes 64x32x256x64,16x32x1024x64 --steps 20

Each shape is BATCHxHEADSxSEQxHEAD_DIM. It times torch.nn.functional.scaled_dot_product_attention
(is_causal=True) on q, k, v of [B, H, T, D] in BF16, forward and forward + backward: with whatever
kernel PyTorch picks there (variant "default"; the row's sdpa_backend names it, from
torch._fused_sdp_choice), and, on CUDA, with its FlashAttention-2 kernel forced (variant "flash":
FlashAttention-2 is the reference issue 47's targets name) and with its cuDNN attention forced
(variant "cudnn"); a kernel that is unavailable there gives a row with its error instead. As
`multinorm bench attention` does, each shape warms up for at least --warmup-ms (150) and --warmup
calls, and each timed window runs at least --steps calls and at least --min-ms (50) of work. FLOPs
as FlashAttention counts them and as multinorm's bench does: 4 x B x H x D x T(T+1)/2 forward, 2.5x
that backward. Where PyTorch has no scaled_dot_product_attention (before 2.0: the CPU PyTorch of the
build machines), the softmax written out is timed instead, and the line says so. One JSON line per
shape and kernel, then a summary line.
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
    """(variant, name, context manager factory or an error, attention function) of what is timed on this device."""
    if not hasattr(F, "scaled_dot_product_attention"):
        return [("default", "written out (no scaled_dot_product_attention in PyTorch %s)" % torch.__version__, contextlib.nullcontext,
                 written_out)]
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = [("default", "sdpa (PyTorch's choice)", contextlib.nullcontext, sdpa)]
    if device.type == "cuda":
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
        except ImportError as e:
            SDPBackend = sdpa_kernel = None
            missing = f"torch.nn.attention.sdpa_kernel: not in PyTorch {torch.__version__} ({e})"
        for variant, name, member in (("flash", "sdpa flash_attention", "FLASH_ATTENTION"), ("cudnn", "sdpa cudnn_attention", "CUDNN_ATTENTION")):
            if SDPBackend is None:
                out.append((variant, name, missing, sdpa))
            elif not hasattr(SDPBackend, member):
                out.append((variant, name, f"SDPBackend.{member}: not in PyTorch {torch.__version__}", sdpa))
            else:
                out.append((variant, name, (lambda b: lambda: sdpa_kernel(b))(getattr(SDPBackend, member)), sdpa))
    return out


# at::SDPBackend's values (ATen/SDPBackend.h), where SDPBackend's members do not say
SDP_BACKENDS = {0: "math", 1: "flash_attention", 2: "efficient_attention", 3: "cudnn_attention", 4: "overrideable"}


def sdpa_choice(q, k, v):
    """The kernel scaled_dot_product_attention dispatches to for these inputs (under the current
    sdpa_kernel context), from torch._fused_sdp_choice; None where this PyTorch cannot say."""
    try:
        idx = int(torch._fused_sdp_choice(q, k, v, None, 0.0, True))
    except Exception as e:
        return f"unknown ({type(e).__name__}: {str(e)[:200]})"
    try:
        from torch.nn.attention import SDPBackend
        for name, member in SDPBackend.__members__.items():
            if int(member) == idx:
                return name.lower()
    except Exception:
        pass
    return SDP_BACKENDS.get(idx, str(idx))


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_up(fn, calls, seconds, device):
    """Untimed calls, each waited for, until at least `calls` ran and `seconds` passed: (calls, seconds)."""
    t0 = time.perf_counter()
    n = 0
    while n < calls or time.perf_counter() - t0 < seconds:
        fn()
        sync(device)
        n += 1
    return n, time.perf_counter() - t0


def seconds_per_call(fn, min_calls, min_seconds, device, max_calls=100000):
    """(seconds per call, calls) over a window of back-to-back calls of at least min_calls and at least
    min_seconds (a window of short kernels is not a few launches): sized from one call timed alone,
    timed again, longer, while it comes out short."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    single = time.perf_counter() - t0
    calls = min(max_calls, max(min_calls, math.ceil(min_seconds / max(single, 1e-7))))
    while True:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync(device)
        window = time.perf_counter() - t0
        if window >= min_seconds or calls >= max_calls:
            return window / calls, calls
        calls = min(max_calls, max(calls + 1, math.ceil(1.2 * calls * min_seconds / max(window, 1e-9))))


def time_shape(B, H, T, D, device, dtype, a, variant, name, context, attend):
    row = {"batch": B, "heads": H, "seq": T, "head_dim": D, "variant": variant, "kernel": name}
    if isinstance(context, str):  # this PyTorch has no way to force the kernel
        return dict(row, error=context)
    # Drawn where they are used: drawing 100M+ normals on the CPU and copying them took seconds a shape.
    torch.manual_seed(1)
    q, k, v = (torch.randn(B, H, T, D, device=device, dtype=dtype).requires_grad_() for _ in range(3))
    dout = torch.randn(B, H, T, D, device=device, dtype=dtype)

    def forward():
        with torch.no_grad():
            attend(q, k, v)

    def forward_backward():
        out = attend(q, k, v)
        q.grad = k.grad = v.grad = None
        out.backward(dout)

    with context():
        if hasattr(F, "scaled_dot_product_attention"):
            row["sdpa_backend"] = sdpa_choice(q, k, v)
        warmup_calls, warmup_s = warm_up(forward_backward, a.warmup, a.warmup_ms / 1e3, device)
        fwd_s, fwd_calls = seconds_per_call(forward, a.steps, a.min_ms / 1e3, device)
        fb_s, fb_calls = seconds_per_call(forward_backward, a.steps, a.min_ms / 1e3, device)
    f = forward_flops(B, H, T, D)
    return dict(row, forward_s=fwd_s, forward_backward_s=fb_s, forward_calls=fwd_calls, forward_backward_calls=fb_calls,
                warmup_calls=warmup_calls, warmup_s=warmup_s, forward_tflops=f / fwd_s / 1e12, forward_backward_tflops=3.5 * f / fb_s / 1e12)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", required=True, help="comma-separated BATCHxHEADSxSEQxHEAD_DIM")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--steps", type=int, default=20, help="timed calls of each, at least")
    ap.add_argument("--warmup", type=int, default=3, help="untimed forward + backward calls first, at least")
    ap.add_argument("--warmup-ms", type=float, default=150.0, help="... and at least this many milliseconds of them")
    ap.add_argument("--min-ms", type=float, default=50.0, help="each timed window at least this many milliseconds")
    a = ap.parse_args()
    device = torch.device(a.device)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    rows, errors = [], []
    for shape in a.shapes.split(","):
        B, H, T, D = (int(x) for x in shape.lower().split("x"))
        for variant, name, context, attend in kernels(device):
            try:
                row = time_shape(B, H, T, D, device, dtype, a, variant, name, context, attend)
            except Exception as e:  # a kernel PyTorch refuses for this shape or device is reported, not fatal
                row = {"batch": B, "heads": H, "seq": T, "head_dim": D, "variant": variant, "kernel": name,
                       "error": f"{type(e).__name__}: {e}"[:1000]}
            if device.type == "cuda":
                torch.cuda.empty_cache()
            if "error" in row:
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
