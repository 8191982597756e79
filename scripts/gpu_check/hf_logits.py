"""An exported model loaded by Hugging Face transformers, its logits against ours (scripts/gpu_check.sh).

    python3 scripts/gpu_check/hf_logits.py EXPORT_DIR --device cuda --out hf_logits.json

EXPORT_DIR is what `multinorm export --dtype fp32 --logits N` wrote: model.safetensors, config.json and
multinorm_logits.safetensors (our FP32 logits of those weights on N fixed tokens). This loads the
directory with transformers.LlamaForCausalLM.from_pretrained in FP32, runs the same tokens and writes
the differences. Bound: ||ours - theirs|| / ||theirs|| <= 1e-4. Both sides compute in FP32 (cuBLASLt's
32-bit compute and PyTorch's default, no TF32), so only the summation order differs: the CPU
cross-check of the same model code measured 2.5e-7 (tests/torch_crosscheck.py); 1e-4 leaves room for
a GPU's reduction orders over llama_60m's depth and still catches a wrong tensor (those differ by O(1)).

Without transformers (the build machines), the status is "skipped: transformers not installed", and
the same comparison is made with bench/torch_llama.py's independent LLaMA instead, as "fallback".
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

BOUND = 1e-4


def read_f32_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if e["dtype"] != "F32":
            raise ValueError(f"{path}: {name} is {e['dtype']}, expected F32 (export with --dtype fp32)")
        b, en = e["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[8 + n + b:8 + n + en], dtype="<f4").reshape(e["shape"]).copy())
    return out


def compare(ours, theirs):
    diff = (ours - theirs).abs()
    scale = float(theirs.abs().max())
    return {"max_abs_error": float(diff.max()), "max_abs_logit": scale,
            "max_error_relative_to_largest_logit": float(diff.max()) / max(scale, 1e-30),
            "relative_error": float((ours - theirs).norm() / max(float(theirs.norm()), 1e-30)),
            "argmax_agreement": float((ours.argmax(-1) == theirs.argmax(-1)).float().mean()), "bound": BOUND}


def torch_llama_logits(d, tokens, device):
    """The same weights in bench/torch_llama.py's LLaMA (the fallback without transformers)."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "bench"))
    from torch_llama import Llama  # noqa: E402
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    weights = read_f32_safetensors(os.path.join(d, "model.safetensors"))
    model = Llama(cfg, tokens.shape[1])
    with torch.no_grad():
        for name, p in model.hf_parameters().items():
            p.copy_(weights[name])
        return model.to(device)(tokens.to(device)).float().cpu()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("export_dir")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    ours = read_f32_safetensors(os.path.join(a.export_dir, "multinorm_logits.safetensors"))
    tokens = ours["tokens"].to(torch.long)
    r = {"export_dir": a.export_dir, "tokens": int(tokens.numel()), "vocab": int(ours["logits"].shape[-1]), "device": a.device,
         "torch": torch.__version__}
    try:
        import transformers
    except ImportError:
        r.update(status="skipped", reason="transformers not installed")
        r["fallback"] = dict(compare(ours["logits"], torch_llama_logits(a.export_dir, tokens, a.device)),
                             against="bench/torch_llama.py's LLaMA (not transformers)")
    else:
        # (no dtype argument: its name changed across versions; the export's config says float32)
        model = transformers.LlamaForCausalLM.from_pretrained(a.export_dir).float().to(a.device).eval()
        with torch.no_grad():
            theirs = model(tokens.to(a.device)).logits.float().cpu()
        r.update(compare(ours["logits"], theirs), transformers=transformers.__version__)
        r["status"] = "ok" if r["relative_error"] <= BOUND else "failed"
        if r["status"] == "failed":
            r["reason"] = f"relative error {r['relative_error']:.3e} above the bound {BOUND:g}"
    with open(a.out, "w") as f:
        json.dump(r, f, indent=1)
    print(json.dumps(r))
    sys.exit(1 if r["status"] == "failed" else 0)


if __name__ == "__main__":
    main()
