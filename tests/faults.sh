#!/usr/bin/env bash
# Faults a long run meets, injected on a tiny model, each with the outcome asserted:
#   - two trainers on one run directory: the second is refused at once, naming the first's pid and host;
#   - a kill -9 at each point of the update's end (metrics written, checkpoint files written, checkpoint
#     published): the resumed run loses no metrics line and its checkpoints stay whole.
# usage: faults.sh <multinorm binary>
set -uo pipefail
bin=$(realpath "$1") fixtures=$(realpath "$(dirname "$0")/fixtures")
tmp=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
cd "$tmp"
source "$fixtures/tiny_shards.sh"
make_tiny_shards "$bin"
fail() { echo "FAIL: $*"; exit 1; }
"$bin" config -c run.json --set batch.global_batch=4 --set batch.micro_batch=2 --set backend=cpu --set eval.tokens=300 \
  --set checkpoint.every=2 -o run.json

# ---- two trainers on one run directory ----
"$bin" train -c run.json --set output_dir=runs/shared --set schedule.total_steps=100000 --quiet > a.txt 2>&1 &
a=$!
for _ in $(seq 200); do grep -q "^pid $a " runs/shared/.lock 2>/dev/null && break; sleep 0.05; done
grep -q "^pid $a on $(hostname)" runs/shared/.lock || fail "the first trainer did not record itself in runs/shared/.lock"
out=$("$bin" train -c run.json --set output_dir=runs/shared --quiet 2>&1); rc=$?
[ $rc -ne 0 ] || fail "a second trainer on the same run directory ran"
grep -q "in use by another trainer (pid $a on $(hostname)" <<<"$out" || fail "the refusal does not name the holder: $out"
kill -0 $a 2>/dev/null || fail "the first trainer died"
kill -9 $a; wait $a 2>/dev/null
# Its lock went with it: the next trainer resumes.
"$bin" train -c run.json --set output_dir=runs/shared --set schedule.total_steps=100000 --max-updates 2 --resume --quiet > /dev/null 2>&1 ||
  fail "the lock outlived its holder"
echo "faults: a second trainer is refused, naming pid $a; the lock dies with its holder"

# ---- kill -9 at each point of an update's end, then resume ----
for point in metrics-written checkpoint-written checkpoint-published; do
  dir=runs/kill-$point
  MULTINORM_FAULT=$point "$bin" train -c run.json --set output_dir=$dir --quiet > /dev/null 2>&1
  rc=$?
  [ $rc -eq 137 ] || fail "$point: exit $rc, expected the SIGKILL's 137"
  "$bin" train -c run.json --set output_dir=$dir --resume --quiet > resume.txt 2>&1 || { cat resume.txt; fail "$point: resume"; }
  # every update's line, once: none lost between a checkpoint and the kill, none repeated by the resume
  steps=$(/usr/bin/python3 -c "
import json
s = [json.loads(l)['step'] for l in open('$dir/metrics.jsonl') if json.loads(l)['type'] == 'train']
print(' '.join(map(str, s)))")
  [ "$steps" = "1 2 3 4 5 6" ] || fail "$point: metrics steps after the resume: $steps"
  ls "$dir/checkpoints" | grep -q tmp && fail "$point: a checkpoint temporary is left: $(ls $dir/checkpoints)"
  [ -f "$dir/checkpoints/step_00000006/model.safetensors" ] || fail "$point: no final checkpoint"
done
echo "faults: a kill -9 at metrics-written, checkpoint-written, checkpoint-published loses no metrics line"

# ---- shards tied to their tokenizer, layout and vocabulary ----
"$bin" data train-tokenizer -i 'c4-validation.*.json.gz' -o other --vocab-size 300 > /dev/null 2>&1 || fail "a second tokenizer"
cmp -s tok.model other.model && fail "the second tokenizer is the same file"
"$bin" data tokenize -i 'c4-*.json.gz' -t other.model -o shards_other --seq-len 32 > /dev/null 2>&1 || fail "tokenize with the second"
expect_error() {  # expect_error <what> <pattern> -- command...
  local what=$1 pattern=$2; shift 3
  local out; out=$("$@" 2>&1); local rc=$?
  [ $rc -ne 0 ] || fail "$what: exit 0"
  grep -qE -- "$pattern" <<<"$out" || fail "$what: the error does not say '$pattern': $out"
}
expect_error "shards of another tokenizer" "c4-train\.[0-9of-]+\.tok: tokenized with the tokenizer of hash [0-9a-f]{16}, data.tokenizer tok.model has hash [0-9a-f]{16}" -- \
  "$bin" train -c run.json --set output_dir=runs/t1 --set 'data.train=shards_other/c4-train.*.tok' --quiet
expect_error "a data.tokenizer that does not exist" "data.tokenizer: nowhere.model does not exist" -- \
  "$bin" train -c run.json --set output_dir=runs/t3 --set data.tokenizer=nowhere.model --quiet
expect_error "rows shards read as a stream" "its layout is rows, data.layout is stream" -- \
  "$bin" train -c run.json --set output_dir=runs/t4 --set data.layout=stream --quiet
# Without data.tokenizer the shards' record is taken, and said.
out=$("$bin" train -c run.json --set output_dir=runs/t5 --set data.tokenizer= --max-updates 1 2>&1) || fail "training without data.tokenizer: $out"
grep -q "data.tokenizer is not set: the shards record tokenizer hash" <<<"$out" || fail "no note of the shards' tokenizer: $out"
# A checkpoint knows its tokenizer: generate and eval with another are refused.
"$bin" train -c run.json --set output_dir=runs/t6 --max-updates 2 --quiet > /dev/null 2>&1 || fail "training for the generate check"
expect_error "generate with another tokenizer" "other.model: not the tokenizer .* was trained with" -- \
  "$bin" generate --checkpoint runs/t6 --tokenizer other.model --prompt "the" --tokens 3
"$bin" generate --checkpoint runs/t6 --prompt "the" --tokens 3 > /dev/null 2>&1 || fail "generate with its own tokenizer"
expect_error "eval on shards of another tokenizer" "tokenized with another tokenizer than the one" -- \
  "$bin" eval --checkpoint runs/t6 --data 'shards_other/c4-validation.*.tok'
echo "faults: shards of another tokenizer, vocabulary or layout, a missing tokenizer, generate and eval with another one: named errors"

# ---- checkpoints verified before use ----
"$bin" train -c run.json --set output_dir=runs/c --quiet > /dev/null 2>&1 || fail "training for the checkpoint checks"
ck=runs/c/checkpoints
ls $ck | grep -qx step_00000004 && ls $ck | grep -qx step_00000006 || fail "checkpoints 4 and 6: $(ls $ck)"
"$bin" checkpoint verify runs/c > verify.txt || { cat verify.txt; fail "checkpoint verify of a good run"; }
for f in model.safetensors optimizer.bin trainer_state.json config.json run_config.json; do
  cp -r $ck/step_00000006 saved
  size=$(stat -c %s $ck/step_00000006/$f)
  # one byte flipped in the middle: the size and every header intact
  /usr/bin/python3 -c "
import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[len(b) // 2] ^= 0x01; open(p, 'wb').write(b)" $ck/step_00000006/$f
  [ "$(stat -c %s $ck/step_00000006/$f)" = "$size" ] || fail "the flip changed the size"
  expect_error "checkpoint verify, $f flipped" "step_00000006/$f is damaged" -- "$bin" checkpoint verify $ck/step_00000006
  expect_error "resume, $f flipped" "step_00000006/$f is damaged" -- "$bin" train -c run.json --set output_dir=runs/c --resume --quiet
  grep -q "the previous checkpoint is runs/c/checkpoints/step_00000004: resume from it with --resume-from" <<<"$(
    "$bin" train -c run.json --set output_dir=runs/c --resume --quiet 2>&1)" || fail "resume, $f flipped: the previous checkpoint is not offered"
  if [ $f != optimizer.bin ]; then  # eval, generate and export do not read the optimizer's state
    expect_error "eval, $f flipped" "$f is damaged" -- "$bin" eval --checkpoint $ck/step_00000006
    expect_error "generate, $f flipped" "$f is damaged" -- "$bin" generate --checkpoint $ck/step_00000006 --prompt the --tokens 2
  fi
  if [ $f = model.safetensors ] || [ $f = config.json ]; then
    expect_error "export, $f flipped" "$f is damaged" -- "$bin" export -c run.json --from $ck/step_00000006 --out exported
  fi
  rm -rf $ck/step_00000006 && mv saved $ck/step_00000006
done
"$bin" checkpoint verify $ck/step_00000006 > /dev/null || fail "the restored checkpoint"
# --resume-from the earlier one, by name
"$bin" train -c run.json --set output_dir=runs/c --set schedule.total_steps=8 --allow-config-change --resume-from $ck/step_00000004 --quiet > /dev/null 2>&1 ||
  fail "--resume-from an earlier checkpoint"
# a checkpoint without its manifest is not one; an edited trainer_state.json is damaged
rm $ck/step_00000008/manifest.json
expect_error "no manifest" "no manifest.json: not a complete checkpoint" -- "$bin" eval --checkpoint $ck/step_00000008
sed -i 's/"position": [0-9]*/"position": 999999/' $ck/step_00000006/trainer_state.json
expect_error "an edited cursor" "trainer_state.json is damaged" -- "$bin" train -c run.json --set output_dir=runs/c --resume-from $ck/step_00000006 --quiet
echo "faults: a flipped byte in any checkpoint file: named error from verify, resume (naming the previous checkpoint), eval, generate, export"

# ---- a run directory where a checkpoint is expected, or the reverse: told which to pass ----
expect_error "--resume-from a run directory" "runs/c: not a checkpoint directory, but a run directory: pass one of its checkpoints, e.g. --resume-from runs/c/checkpoints/step_[0-9]+, or --resume" -- \
  "$bin" train -c run.json --set output_dir=runs/c --resume-from runs/c --quiet
expect_error "compare a checkpoint directory" "step_00000006: a checkpoint directory; compare takes run directories" -- "$bin" compare $ck/step_00000006 runs/c
"$bin" export -c run.json --from runs/c --out exported_latest > export.txt 2>&1 || { cat export.txt; fail "export --from a run directory"; }
grep -q "wrote exported_latest/model.safetensors" export.txt || fail "export --from a run directory: $(cat export.txt)"
echo "faults: a run directory for --resume-from, a checkpoint for compare: told which to pass; export takes either"

# ---- divergence: detected, named, and the exit status and result.json say so ----
for o in sinkgd sgd adam; do
  out=$("$bin" train -c run.json --set output_dir=runs/lr-$o --set optimizer.name=$o --set optimizer.lr=1e6 --set precision.params=fp32 \
    --set precision.optimizer_states=fp32 2>&1); rc=$?
  [ $rc -eq 3 ] || fail "lr 1e6 with $o: exit $rc, expected 3 (diverged): $out"
  grep -q "update [0-9] diverged: " <<<"$out" || fail "lr 1e6 with $o: no 'diverged' naming the update: $out"
  /usr/bin/python3 -c "
import json, sys; r = json.load(open('runs/lr-$o/result.json'))
assert r['diverged'] is True and r['divergence']['step'] <= 3, r" || fail "lr 1e6 with $o: result.json"
done
# rollback: to the last good checkpoint with a lower learning rate; too high still: stopped after max_rollbacks
"$bin" train -c run.json --set output_dir=runs/rb --max-updates 2 --quiet > /dev/null 2>&1 || fail "the run to roll back to"
out=$("$bin" train -c run.json --set output_dir=runs/rb --resume --allow-config-change --set optimizer.lr=1e6 --set divergence.action=rollback 2>&1); rc=$?
[ $rc -eq 3 ] || fail "rollbacks that cannot help: exit $rc"
[ "$(grep -c 'rolling back to runs/rb/checkpoints/step_00000002' <<<"$out")" -eq 3 ] || fail "three rollbacks expected: $out"
[ "$(grep -c '"type": *"divergence"\|"type":"divergence"' runs/rb/metrics.jsonl)" -eq 4 ] || fail "four divergence lines in metrics.jsonl"
# ... and one that helps: the run completes, result.json counts the rollback
"$bin" train -c run.json --set output_dir=runs/rb2 --max-updates 2 --quiet > /dev/null 2>&1 || fail "the second run to roll back to"
"$bin" train -c run.json --set output_dir=runs/rb2 --resume --allow-config-change --set optimizer.lr=1e6 --set divergence.action=rollback \
  --set divergence.rollback_lr_factor=1e-7 --quiet > /dev/null 2>&1 || fail "a rollback that helps"
/usr/bin/python3 -c "
import json; r = json.load(open('runs/rb2/result.json')); assert r['diverged'] is False and r['rollbacks'] == 1, r" || fail "rb2 result.json"
echo "faults: lr 1e6 (sinkgd, sgd, fp32 adam): exit 3 and result.json diverged at update <= 3; rollbacks: 3 then stop, or 1 and complete"
