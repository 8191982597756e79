"""Independent cross-check of multinorm's LLaMA against PyTorch autograd.

tests/dump_for_torch writes the model (HF safetensors + config.json), a batch with padding, and
multinorm's loss, logits and gradients; this script builds the same LLaMA in PyTorch
(bench/torch_llama.py), loads the weights by their Hugging Face names, and compares.
Bounds are a small multiple (4-10x) of what was measured (2 cores, AVX512_BF16):
FP32: relative error <= 2e-7 on the loss (measured 1.7e-8), <= 2e-6 on logits (2.5e-7) and on each
parameter's gradient, ||g - g_torch|| / ||g_torch|| <= 3e-6 (worst tensor 5.5e-7).
BF16 (both sides store weights and activations in bf16, with different rounding points): loss
<= 2e-6 (measured 2.0e-7), logits <= 1e-2 (4.7e-3), each gradient <= 2.5e-2 (worst 9.8e-3) with
cosine similarity >= 0.999.
    python3 tests/torch_crosscheck.py <dump dir>
"""
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from torch_llama import Llama, loss_fn  # noqa: E402


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, en = e["data_offsets"]
        raw = data[base + b:base + en]
        if e["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        elif e["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{path}: unsupported dtype {e['dtype']}")
        out[name] = torch.from_numpy(a.reshape(e["shape"]).copy())
    return out


def rel(a, b):
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


def main():
    d = sys.argv[1]
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(d, "batch.json")) as f:
        batch = json.load(f)
    B, T, bf16 = batch["B"], batch["T"], batch["precision"] == "bf16"
    weights = read_safetensors(os.path.join(d, "model.safetensors"))
    ours_grads = read_safetensors(os.path.join(d, "grads.safetensors"))
    ours_logits = read_safetensors(os.path.join(d, "logits.safetensors"))["logits"]

    torch.manual_seed(0)
    model = Llama(cfg, T)
    params = model.hf_parameters()
    assert set(params) == set(weights), f"tensor names differ: {set(params) ^ set(weights)}"
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(weights[name])
    if bf16:
        model = model.to(torch.bfloat16)
        params = model.hf_parameters()
    tokens = torch.tensor(batch["tokens"]).view(B, T)
    targets = torch.tensor(batch["targets"]).view(B, T)
    mask = torch.tensor(batch["mask"]).view(B, T)
    logits = model(tokens)
    loss = loss_fn(logits, targets, mask)
    loss.backward()

    failures = []
    loss_err = abs(batch["loss"] - float(loss)) / abs(float(loss))
    print(f"loss: multinorm {batch['loss']:.6f}  torch {float(loss):.6f}  rel err {loss_err:.2e}")
    if loss_err > (2e-6 if bf16 else 2e-7):
        failures.append("loss")
    logit_err = rel(ours_logits, logits.detach().float())
    print(f"logits: rel err {logit_err:.2e}")
    if logit_err > (1e-2 if bf16 else 2e-6):
        failures.append("logits")
    worst = (0.0, "")
    for name, p in params.items():
        g = p.grad.float()
        e = rel(ours_grads[name], g)
        cos = float(torch.nn.functional.cosine_similarity(ours_grads[name].flatten(), g.flatten(), dim=0))
        worst = max(worst, (e, name))
        if (bf16 and (cos < 0.999 or e > 2.5e-2)) or (not bf16 and e > 3e-6):
            failures.append(f"{name} (rel err {e:.2e}, cosine {cos:.5f})")
    print(f"gradients: {len(params)} tensors, worst rel err {worst[0]:.2e} ({worst[1]})")
    if failures:
        print("FAILED: " + ", ".join(failures))
        sys.exit(1)
    print(f"torch cross-check ({batch['precision']}): OK")


if __name__ == "__main__":
    main()
