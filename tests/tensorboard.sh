#!/usr/bin/env bash
# TensorBoard event files (log.tensorboard): a run's files decode, outside multinorm (the framing's
# CRCs computed bit by bit, the events by python3-protobuf: tests/decode_tfevents.py), to exactly
# the scalars of its metrics.jsonl; a resume from an earlier checkpoint marks a session start there,
# after which TensorBoard holds each update once; a flipped byte is caught; the switch turns it off.
# usage: tensorboard.sh <multinorm binary>
set -uo pipefail
bin=$(realpath "$1")
src=$(realpath "$(dirname "$0")/..")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
source "$src/tests/fixtures/tiny_shards.sh"
make_tiny_shards "$bin"
fail() { echo "FAIL: $*"; exit 1; }
decode() { /usr/bin/python3 "$src/tests/decode_tfevents.py" "$1" "$src/src/train/tensorboard_event.proto" "${@:2}"; }
"$bin" config -c run.json --set batch.global_batch=4 --set batch.micro_batch=2 --set backend=cpu --set threads=1 \
  --set schedule.total_steps=20 --set checkpoint.every=10 --set eval.every=10 --set eval.tokens=300 -o run.json
"$bin" train -c run.json --set output_dir=run --quiet > train.log 2>&1 || { cat train.log; fail "training"; }
decode run --expect-starts 1 || fail "the event file of a straight run"
# Resumed from update 10's checkpoint: updates 11-20 again, a second file starting a session at 11.
"$bin" train -c run.json --set output_dir=run --resume-from run/checkpoints/step_00000010 --quiet > resume.log 2>&1 ||
  { cat resume.log; fail "the resume"; }
decode run --expect-starts 1,11 || fail "the event files after a resume"
# A flipped byte in a record is an error naming the file (the checker fires).
mkdir flipped && cp run/metrics.jsonl flipped/ && cp "$(ls run/events.out.tfevents.* | head -1)" flipped/
f=$(ls flipped/events.out.tfevents.*)
printf '\xff' | dd of="$f" bs=1 seek=100 conv=notrunc status=none
out=$(decode flipped 2>&1) && fail "a flipped byte went unnoticed"
grep -q "CRC" <<<"$out" || fail "a flipped byte: $out"
# The switch.
"$bin" train -c run.json --set output_dir=off --set log.tensorboard=false --quiet > off.log 2>&1 || { cat off.log; fail "training without"; }
ls off/events.out.tfevents.* > /dev/null 2>&1 && fail "log.tensorboard=false wrote an event file"
echo "tensorboard: event files decode to metrics.jsonl's scalars, a resume starts a session, a flipped byte is caught, the switch works"
