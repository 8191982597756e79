#!/usr/bin/env bash
# `multinorm export` writes a directory that loads as a model and a tokenizer, with the special ids
# training used, read back with SentencePiece (an independent reader of the exported model file):
#   - our trained tokenizer (unk 0, bos 1, eos 2, no pad) and a T5-layout one (pad 0, eos 1, unk 2,
#     no BOS, as T5's spiece.model): tokenizer.model is the run's byte for byte; config.json,
#     generation_config.json and tokenizer_config.json carry the ids the shards recorded; nothing adds
#     a BOS training never saw;
#   - a tokenizer other than the checkpoint's is refused;
#   - where transformers is installed (GPU nodes), AutoTokenizer encodes as SentencePiece does.
# usage: export_hf.sh <multinorm binary>
set -uo pipefail
bin=$(realpath "$1") fixtures=$(realpath "$(dirname "$0")/fixtures")
/usr/bin/python3 -c "import sentencepiece" 2> /dev/null || { echo "export_hf: python3-sentencepiece missing: skipped"; exit 77; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
source "$fixtures/tiny_shards.sh"
make_tiny_shards "$bin"
fail() { echo "FAIL: $*"; exit 1; }
"$bin" config -c run.json --set backend=cpu --set threads=1 --set schedule.total_steps=2 --set eval.tokens=200 -o run.json

# A T5-layout tokenizer, trained by SentencePiece's own trainer, and shards made with it.
zcat c4-train.*.json.gz | /usr/bin/python3 -c "import json, sys; [print(json.loads(l)['text']) for l in sys.stdin]" > text.txt
/usr/bin/python3 - <<'PY' > /dev/null 2>&1 || fail "training the T5-layout tokenizer"
import sentencepiece as spm
spm.SentencePieceTrainer.train(input="text.txt", model_prefix="t5like", vocab_size=300, model_type="unigram",
                               pad_id=0, eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False)  # (a small corpus)
PY
"$bin" data tokenize -i 'c4-*.json.gz' -t t5like.model -o shards_t5 --seq-len 32 > /dev/null 2>&1 || fail "tokenize with t5like.model"

# check_export DIR TOKENIZER SHARD: the exported files against SentencePiece and the shard's header
check_export() {
  cmp -s "$1/tokenizer.model" "$2" || fail "$1/tokenizer.model is not $2"
  local header; header=$("$bin" data inspect "$3" | head -1)
  /usr/bin/python3 - "$1" "$2" "$header" <<'PY' || fail "$1: the exported ids disagree (above)"
import json, re, sys
import sentencepiece as spm
out, model, header = sys.argv[1], sys.argv[2], sys.argv[3]
sp = spm.SentencePieceProcessor(model_file=out + "/tokenizer.model")
cfg, gen, tc, st = (json.load(open(f"{out}/{f}.json")) for f in ("config", "generation_config", "tokenizer_config", "special_tokens_map"))
shard_eos, shard_pad = map(int, re.search(r"eos (-?\d+), pad (-?\d+)", header).groups())
none = lambda i: None if i < 0 else i
checks = {
    "eos = the shards' EOS": cfg["eos_token_id"] == gen["eos_token_id"] == sp.eos_id() == shard_eos,
    "pad = what rows were padded with": cfg["pad_token_id"] == gen["pad_token_id"] == (shard_pad if shard_pad >= 0 else shard_eos),
    "bos = the tokenizer's": cfg["bos_token_id"] == gen["bos_token_id"] == none(sp.bos_id()),
    "no BOS or EOS added": tc["add_bos_token"] is False and tc["add_eos_token"] is False,
    "special pieces": tc["eos_token"] == st["eos_token"] == sp.id_to_piece(sp.eos_id())
                      and tc["unk_token"] == sp.id_to_piece(sp.unk_id())
                      and tc["bos_token"] == (sp.id_to_piece(sp.bos_id()) if sp.bos_id() >= 0 else None),
    "vocabulary fits": sp.get_piece_size() <= cfg["vocab_size"],
}
for name, ok in checks.items():
    if not ok: print(f"  {name}: no (config {cfg}, generation {gen}, tokenizer {tc}, header '{header}')")
try:
    from transformers import AutoTokenizer
except ImportError:
    sys.exit(0 if all(checks.values()) else 1)
text = "The history of the city began in 1820, when the first settlers arrived."
hf = AutoTokenizer.from_pretrained(out, use_fast=False)
if hf(text)["input_ids"] != sp.encode(text):
    print(f"  AutoTokenizer: {hf(text)['input_ids']}, SentencePiece: {sp.encode(text)}"); sys.exit(1)
print("  transformers' AutoTokenizer encodes as SentencePiece does")
sys.exit(0 if all(checks.values()) else 1)
PY
}

"$bin" train -c run.json --set output_dir=runs/ours --quiet > /dev/null || fail "training with tok.model"
"$bin" export -c run.json --from runs/ours -o hf_ours > out.txt 2>&1 || { cat out.txt; fail "export"; }
grep -q "wrote hf_ours/tokenizer.model (from tok.model)" out.txt || { cat out.txt; fail "export does not say it wrote the tokenizer"; }
check_export hf_ours tok.model shards/c4-train.00000-of-00002.tok
echo "export_hf: our tokenizer (unk 0, bos 1, eos 2): ids agree"

"$bin" train -c run.json --set output_dir=runs/t5 --set data.tokenizer=t5like.model --set 'data.train=shards_t5/c4-train.*.tok' \
  --set 'data.validation=shards_t5/c4-validation.*.tok' --quiet > /dev/null || fail "training with t5like.model"
"$bin" export -c run.json --from runs/t5 -o hf_t5 > /dev/null 2>&1 || fail "export of the T5-layout run"
check_export hf_t5 t5like.model shards_t5/c4-train.00000-of-00002.tok
[ "$(/usr/bin/python3 -c "import json; c = json.load(open('hf_t5/config.json')); print(c['bos_token_id'], c['eos_token_id'], c['pad_token_id'])")" = "None 1 0" ] ||
  fail "a T5-layout tokenizer's ids: $(cat hf_t5/config.json)"
echo "export_hf: a T5-layout tokenizer (pad 0, eos 1, unk 2, no BOS): ids agree"

out=$("$bin" export -c run.json --from runs/t5 --tokenizer tok.model -o hf_wrong 2>&1) && fail "another tokenizer was exported"
grep -q "tok.model is not the tokenizer runs/t5/checkpoints/step_00000002 was trained with" <<<"$out" || fail "no reason: $out"
echo "export_hf: passed"
