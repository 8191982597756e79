#!/usr/bin/env python3
"""Builds multinorm's embedded default corpus: real English text shipped in Debian packages,
converted to the C4 on-disk format (gzip JSON Lines with text, timestamp, url), so that the very same
reader serves C4 and the default corpus.

    python3 data_tools/build_default_corpus.py --out data/default [--cache data/cache]

Sources (each document gets a pseudo-url debian:<package>/<path>#<part>): the Python 3.11 docs, the
PostgreSQL 15 docs, the perl docs, the King James Bible (by chapter), the Jargon File (by entry), the
Devil's Dictionary (by entry) and fortunes (ten per document). Packages are fetched with
`apt-get download` and unpacked with `dpkg-deb -x` (nothing is installed). The output is stable:
documents sorted by url, a fixed timestamp, gzip with mtime 0, and the validation split (~2%) chosen
by a hash of the url, preferring the literature sources. Rebuilding gives byte-identical files.
Licences: see data_tools/NOTICE.md (copied next to the output).
"""
import argparse
import glob
import gzip
import hashlib
import html.parser
import io
import json
import os
import re
import shutil
import subprocess
import sys

PACKAGES = ["python3.11-doc", "postgresql-doc-15", "perl-doc", "bible-kjv-text", "bible-kjv", "jargon-text",
            "dict-devil", "fortunes"]
LITERATURE = {"bible-kjv-text", "jargon-text", "dict-devil", "fortunes"}
TIMESTAMP = "2019-04-25T00:00:00Z"
TRAIN_SHARDS = 4


def log(msg):
    print(f"[corpus] {msg}", file=sys.stderr, flush=True)


def fetch(cache):
    """apt-get download each package into cache/debs (kept between runs) and unpack it."""
    debs = os.path.join(cache, "debs")
    root = os.path.join(cache, "root")
    os.makedirs(debs, exist_ok=True)
    missing = [p for p in PACKAGES if not glob.glob(os.path.join(debs, f"{p}_*.deb"))]
    if missing:
        log(f"apt-get download {' '.join(missing)}")
        r = subprocess.run(["apt-get", "download", *missing], cwd=debs, stdout=subprocess.DEVNULL)
        if r.returncode != 0:  # package lists missing or stale on a fresh machine: refresh once
            log("apt-get update")
            subprocess.run(["apt-get", "update", "-qq"], check=True)
            subprocess.run(["apt-get", "download", *missing], cwd=debs, check=True, stdout=subprocess.DEVNULL)
    if not os.path.isdir(root):
        tmp = root + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        for deb in sorted(glob.glob(os.path.join(debs, "*.deb"))):
            subprocess.run(["dpkg-deb", "-x", deb, tmp], check=True)
        os.rename(tmp, root)
    return root


def clean(text):
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{2,}", "\n", text)  # C4 separates paragraphs by a single newline
    return text.strip()


def python_docs(root):
    base = os.path.join(root, "usr/share/doc/python3.11/html/_sources")
    for path in sorted(glob.glob(os.path.join(base, "**/*.rst.txt"), recursive=True)):
        rel = os.path.relpath(path, base)
        with open(path, encoding="utf-8", errors="replace") as f:
            yield "python3.11-doc", f"debian:python3.11-doc/{rel}", f.read()


class _HtmlText(html.parser.HTMLParser):
    SKIP = {"pre", "code", "table", "script", "style", "head", "nav"}

    def __init__(self):
        super().__init__()
        self.out, self.depth = [], 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP or (tag == "div" and ("class", "navheader") in attrs) or (tag == "div" and ("class", "navfooter") in attrs):
            self.depth += 1
        elif tag in ("p", "br", "h1", "h2", "h3", "h4", "li", "dt", "dd") and not self.depth:
            self.out.append("\n")

    def handle_endtag(self, tag):
        if self.depth and tag in self.SKIP | {"div"}:
            self.depth -= 1 if tag != "div" or self.depth else 0

    def handle_data(self, data):
        if not self.depth:
            self.out.append(re.sub(r"\s+", " ", data))


def postgres_docs(root):
    base = os.path.join(root, "usr/share/doc/postgresql-doc-15/html")
    for path in sorted(glob.glob(os.path.join(base, "*.html"))):
        p = _HtmlText()
        with open(path, encoding="utf-8", errors="replace") as f:
            p.feed(f.read())
        yield "postgresql-doc-15", f"debian:postgresql-doc-15/{os.path.basename(path)}", "".join(p.out)


def perl_docs(root):
    base = os.path.join(root, "usr/share/perl")
    for path in sorted(glob.glob(os.path.join(base, "**/pod/*.pod"), recursive=True)):
        name = os.path.basename(path)
        if re.match(r"perl\d+delta\.pod", name) or "delta" in name:
            continue
        r = subprocess.run(["pod2text", path], capture_output=True, text=True, errors="replace")
        if r.returncode != 0:
            continue
        lines = [l for l in r.stdout.split("\n") if not l.startswith("        ")]  # drop verbatim code
        yield "perl-doc", f"debian:perl-doc/{os.path.relpath(path, base)}", "\n".join(lines)


def bible(root):
    exe = os.path.join(root, "usr/bin/bible")
    r = subprocess.run([exe, "-p", os.path.join(root, "usr/lib"), "Gen1:1-Rev22:21"], capture_output=True,
                       text=True, errors="replace")
    if r.returncode != 0:
        log("bible: the package's CLI failed; skipping the KJV")
        return
    chapter, lines = None, []
    for line in r.stdout.split("\n"):
        m = re.match(r"^([1-3]?\s?[A-Z][A-Za-z ]+) (\d+)$", line.strip())
        if m and not line.startswith(" "):
            if chapter and lines:
                yield "bible-kjv-text", f"debian:bible-kjv-text/{chapter}", " ".join(lines)
            chapter, lines = line.strip().replace(" ", "_"), []
        elif line.strip():
            lines.append(re.sub(r"^\s*\d+\s+", "\n", line.rstrip()) if re.match(r"^\s*\d+\s", line) else line.strip())
    if chapter and lines:
        yield "bible-kjv-text", f"debian:bible-kjv-text/{chapter}", " ".join(lines)


def jargon(root):
    with gzip.open(os.path.join(root, "usr/share/doc/jargon-text/jargon.txt.gz"), "rt", encoding="latin-1") as f:
        text = f.read()
    entries = re.split(r"\n(?=   :[^:\n]+:)", text)
    for i, e in enumerate(entries[1:]):
        m = re.match(r"\s*:([^:\n]+):", e)
        if m:
            yield "jargon-text", f"debian:jargon-text/{i:05d}-{re.sub(r'[^A-Za-z0-9]+', '_', m.group(1))[:40]}", e


_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _dictd_number(s):
    n = 0
    for c in s:
        n = n * 64 + _B64.index(c)
    return n


def devil(root):
    with gzip.open(os.path.join(root, "usr/share/dictd/devil.dict.dz"), "rb") as f:
        data = f.read()
    with open(os.path.join(root, "usr/share/dictd/devil.index"), encoding="latin-1") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 3 or parts[0].startswith("00database"):
                continue
            off, length = _dictd_number(parts[1]), _dictd_number(parts[2])
            yield "dict-devil", f"debian:dict-devil/{parts[0]}", data[off:off + length].decode("latin-1")


def fortunes(root):
    base = os.path.join(root, "usr/share/games/fortunes")
    for path in sorted(glob.glob(os.path.join(base, "*"))):
        if "." in os.path.basename(path) or os.path.isdir(path) or os.path.islink(path):
            continue
        with open(path, encoding="latin-1") as f:
            items = [x.strip() for x in f.read().split("\n%\n") if x.strip()]
        for i in range(0, len(items), 10):
            yield "fortunes", f"debian:fortunes/{os.path.basename(path)}#{i // 10}", "\n".join(items[i:i + 10])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="data/default")
    ap.add_argument("--cache", default="data/cache")
    a = ap.parse_args()
    stamp = os.path.join(a.out, "COMPLETE")
    if os.path.exists(stamp):
        log(f"{a.out} is complete; nothing to do")
        return
    root = fetch(a.cache)
    docs = []
    for source in (python_docs, postgres_docs, perl_docs, bible, jargon, devil, fortunes):
        n = 0
        for pkg, url, text in source(root):
            text = clean(text)
            if len(text) < 200:
                continue
            docs.append((url, pkg, text))
            n += 1
        log(f"{source.__name__}: {n} documents")
    docs.sort()
    train, val = [[] for _ in range(TRAIN_SHARDS)], []
    for url, pkg, text in docs:
        h = int(hashlib.sha256(url.encode()).hexdigest()[:8], 16)
        rate = 25 if pkg in LITERATURE else 100  # ~4% of literature, ~1% of documentation
        rec = json.dumps({"text": text, "timestamp": TIMESTAMP, "url": url}, ensure_ascii=False)
        (val if h % rate == 0 else train[h % TRAIN_SHARDS]).append(rec)
    os.makedirs(a.out, exist_ok=True)

    def write(name, records):
        tmp = os.path.join(a.out, name + ".tmp")
        with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
            gz.write(("\n".join(records) + "\n").encode("utf-8"))
        os.rename(tmp, os.path.join(a.out, name))

    for i, recs in enumerate(train):
        write(f"c4-train.{i:05d}-of-{TRAIN_SHARDS:05d}.json.gz", recs)
    write("c4-validation.00000-of-00001.json.gz", val)
    shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), "NOTICE.md"), os.path.join(a.out, "NOTICE.md"))
    chars = sum(len(t) for _, _, t in docs)
    with open(stamp, "w") as f:
        f.write(f"{len(docs)} documents, {chars} characters, {sum(map(len, train))} train / {len(val)} validation\n")
    log(f"{len(docs)} documents ({chars / 1e6:.1f} M characters): {sum(map(len, train))} train in {TRAIN_SHARDS} "
        f"shards, {len(val)} validation -> {a.out}")


if __name__ == "__main__":
    main()
