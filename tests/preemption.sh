#!/usr/bin/env bash
# A run stopped by its job scheduler (SIGTERM at a time limit, SIGUSR1 sent ahead of it, Ctrl-C's
# SIGINT) ends after an update with its checkpoint written and exit status 75; resumed, it ends with
# the bits of a run never stopped:
#   - one process, each of SIGTERM, SIGINT, SIGUSR1: exit 75, the last update's checkpoint, every
#     metrics line once after the resume, final weights and optimizer state byte-identical;
#   - two MPI ranks, SIGUSR1 to rank 1 only: both ranks stop after the same update, exit 75, the
#     resume is byte-identical;
# usage: preemption.sh <multinorm binary> [mpirun]
set -uo pipefail
bin=$(realpath "$1") mpirun=${2:-}
fixtures=$(realpath "$(dirname "$0")/fixtures")
tmp=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
cd "$tmp"
source "$fixtures/tiny_shards.sh"
make_tiny_shards "$bin"
fail() { echo "FAIL: $*"; exit 1; }
# A long schedule (its updates take a millisecond: the signal comes while it runs), a checkpoint every
# 7 updates (so a stop rarely lands on one), no evaluation. A stopped run is resumed for 5 updates
# more and compared with a straight run of as many (--max-updates: the same schedule).
"$bin" config -c run.json --set batch.global_batch=4 --set batch.micro_batch=2 --set backend=cpu --set threads=1 \
  --set schedule.total_steps=1000000 --set checkpoint.every=7 --set eval.every=0 --set eval.tokens=300 -o run.json
fingerprint() {  # RUN_DIR STEP: the bytes of its final checkpoint
  cat "$1/checkpoints/$(printf 'step_%08d' "$2")"/{model.safetensors,optimizer.bin} | md5sum | cut -d' ' -f1
}
train_steps() {  # the steps of the train lines of RUN_DIR's metrics.jsonl
  /usr/bin/python3 -c "
import json
print(' '.join(str(r['step']) for r in map(json.loads, open('$1/metrics.jsonl')) if r['type'] == 'train'))"
}
wait_for_updates() {  # RUN_DIR N: until N train lines are written (up to 120 s)
  for _ in $(seq 1200); do
    [ "$(grep -c '"type": *"train"' "$1/metrics.jsonl" 2>/dev/null)" -ge "$2" ] 2>/dev/null && return
    sleep 0.1
  done
  fail "$1 wrote no $2 updates"
}
# check_stopped RUN_DIR RC LOG SIGNAL: exit 75, the log names the signal, the last update has its checkpoint
check_stopped() {
  [ "$2" -eq 75 ] || { cat "$3"; fail "$1 stopped by $4: exit $2, expected 75"; }
  grep -q "stopped by $4 after" "$3" || { cat "$3"; fail "$1: no 'stopped by $4' in the log"; }
  local steps last
  steps=$(train_steps "$1"); last=${steps##* }
  [ -f "$1/checkpoints/$(printf 'step_%08d' "$last")/model.safetensors" ] || fail "$1: update $last, its last, has no checkpoint"
  echo "$last"
}
# check_resumed RUN_DIR REFERENCE LAST_UPDATE: every update's line once, the reference's final bits
check_resumed() {
  [ "$(train_steps "$1")" = "$(seq -s ' ' 1 "$3")" ] || fail "$1: metrics steps after the resume: $(train_steps "$1")"
  [ "$(fingerprint "$1" "$3")" = "$(fingerprint "$2" "$3")" ] || fail "$1: the resumed run's final checkpoint differs from $2's"
}
for sig in TERM INT USR1; do
  d=stop_$sig
  "$bin" train -c run.json --set output_dir=$d > $d.log 2>&1 &
  pid=$!
  wait_for_updates $d 3
  kill -$sig $pid
  rc=0; wait $pid || rc=$?
  last=$(check_stopped $d $rc $d.log SIG$sig) || { echo "$last"; exit 1; }
  end=$((last + 5))
  "$bin" train -c run.json --set output_dir=$d --resume --max-updates $end --quiet > resume.log 2>&1 || { cat resume.log; fail "$d: resume"; }
  "$bin" train -c run.json --set output_dir=straight_$sig --max-updates $end --quiet > /dev/null 2>&1 || fail "the straight run"
  check_resumed $d straight_$sig $end
  echo "preemption: SIG$sig after update $last: exit 75, resumed to the straight run's bits"
done

if [ -n "$mpirun" ]; then
  mpi() { "$mpirun" -np 2 --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 "$@"; }
  mpi "$bin" train -c run.json --set output_dir=stop2 > stop2.log 2>&1 &
  launcher=$!
  wait_for_updates stop2 3
  victim=""
  for p in $(pgrep -f "output_dir=stop2" || true); do
    tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && victim=$p
  done
  [ -n "$victim" ] || fail "rank 1 of stop2 not found"
  kill -USR1 "$victim"
  rc=0; wait $launcher || rc=$?
  last=$(check_stopped stop2 $rc stop2.log SIGUSR1) || { echo "$last"; exit 1; }
  grep -q "terminated by signal\|MPI_ABORT\|aborting" stop2.log && { cat stop2.log; fail "stop2: a rank was aborted"; }
  end=$((last + 5))
  mpi "$bin" train -c run.json --set output_dir=stop2 --resume --max-updates $end --quiet > resume.log 2>&1 || { cat resume.log; fail "stop2: resume"; }
  mpi "$bin" train -c run.json --set output_dir=straight2 --max-updates $end --quiet > /dev/null 2>&1 || fail "the straight 2-rank run"
  check_resumed stop2 straight2 $end
  echo "preemption: SIGUSR1 to rank 1 of 2 after update $last: both ranks stopped, exit 75, resumed to the straight run's bits"
fi
echo "preemption: passed"
