#!/usr/bin/env bash
# A run stopped by its job scheduler (SIGTERM at a time limit, SIGUSR1 sent ahead of it, Ctrl-C's
# SIGINT) ends after an update with its checkpoint written and exit status 75; resumed, it ends with
# the bits of a run never stopped:
#   - one process, each of SIGTERM, SIGINT, SIGUSR1: exit 75, the last update's checkpoint, every
#     metrics line once after the resume, final weights and optimizer state byte-identical;
#   - two MPI ranks, SIGUSR1 to rank 1 only: both ranks stop after the same update, exit 75, the
#     resume is byte-identical;
#   - two MPI ranks under scripts/mpirun_graceful.sh: SIGTERM to the launcher (a scheduler's
#     preemption, scancel) stops both after the same update with its checkpoint and exits 75, the
#     resume byte-identical; SIGTERM to every process of the job at once (SLURM's whole-job signal:
#     the launcher, mpirun and both ranks) stops both ranks after the same update with a checkpoint,
#     none killed, within the launcher's grace; the launcher's exit status is the ranks' (75, 0, 2)
#     without waiting out the grace;
# usage: preemption.sh <multinorm binary> [mpirun]
set -uo pipefail
bin=$(realpath "$1") mpirun=${2:-}
src=$(realpath "$(dirname "$0")/..")
source "$(dirname "$0")/fixtures/long_run.sh"
# A stopped run is resumed for 5 updates more and compared with a straight run of as many
# (--max-updates: the same schedule).
fingerprint() {  # RUN_DIR STEP: the bytes of its final checkpoint
  cat "$1/checkpoints/$(printf 'step_%08d' "$2")"/{model.safetensors,optimizer.bin} | md5sum | cut -d' ' -f1
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
  # Rank 0 waits 2 s before its exit (MULTINORM_DELAY), so rank 1 exits 75 first and mpirun ends
  # rank 0 while it leaves: it must still exit 75, reporting no failure.
  "$mpirun" --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 -np 1 env MULTINORM_DELAY=stopped-exit "$bin" train -c run.json \
    --set output_dir=stop2 : -np 1 "$bin" train -c run.json --set output_dir=stop2 > stop2.log 2>&1 &
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

  # SIGTERM to the graceful launcher (exec: the background job is the launcher itself): turned into
  # SIGUSR1 for mpirun, which forwards it to every rank.
  graceful() { MULTINORM_MPIRUN=$mpirun exec bash "$src/scripts/mpirun_graceful.sh" -np 2 --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 "$@"; }
  graceful "$bin" train -c run.json --set output_dir=stop3 > stop3.log 2>&1 &
  launcher=$!
  wait_for_updates stop3 3
  kill -TERM "$launcher"
  t0=$(date +%s)
  rc=0; wait $launcher || rc=$?
  seconds=$(($(date +%s) - t0))
  [ "$seconds" -le 30 ] || fail "stop3: the launcher took $seconds s to end after the ranks' stop (mpirun waited out the grace)"
  last=$(check_stopped stop3 $rc stop3.log SIGUSR1) || { echo "$last"; exit 1; }
  [ "$(grep -c "stopped by SIGUSR1 after update $last" stop3.log)" -ge 1 ] || { cat stop3.log; fail "stop3: not stopped after $last"; }
  end=$((last + 5))
  mpi "$bin" train -c run.json --set output_dir=stop3 --resume --max-updates $end --quiet > resume.log 2>&1 || { cat resume.log; fail "stop3: resume"; }
  mpi "$bin" train -c run.json --set output_dir=straight3 --max-updates $end --quiet > /dev/null 2>&1 || fail "the straight 2-rank run"
  check_resumed stop3 straight3 $end
  echo "preemption: SIGTERM to scripts/mpirun_graceful.sh after update $last: both ranks stopped, exit 75, resumed to the straight run's bits"

  # SIGTERM to every process of the job at once, as SLURM signals a preempted job (the launcher,
  # mpirun and the ranks, each in a process group of its own): each rank takes its own signal and
  # stops after the same update with its checkpoint, inside the grace mpirun now gives before it
  # signals the ranks itself (5 s here; the second SIGTERM is ignored), and the resume is bit-exact.
  MULTINORM_MPI_GRACE_S=5 graceful "$bin" train -c run.json --set output_dir=stop4 > stop4.log 2>&1 &
  launcher=$!
  wait_for_updates stop4 3
  job=$(pgrep -f "output_dir=stop4")
  [ "$(wc -w <<<"$job")" -ge 4 ] || fail "stop4: expected the launcher, mpirun and 2 ranks, found pids $job"
  t0=$(date +%s)
  kill -TERM $job
  rc=0; wait $launcher || rc=$?
  seconds=$(($(date +%s) - t0))
  [ "$rc" -eq 75 ] || { cat stop4.log; fail "stop4: the launcher exited $rc, expected 75"; }
  # The files say how it ended (after its own SIGTERM mpirun may drop the ranks' last lines): the
  # last update has its checkpoint (rank 0 writes it after both ranks' update, and both meet after
  # it) and the resume below is bit-exact. A rank may have taken the launcher's SIGUSR1 (through
  # mpirun) before its own SIGTERM: either stops it.
  grep -q "terminated by signal\|Killed\|MPI_ABORT" stop4.log && { cat stop4.log; fail "stop4: a rank was killed"; }
  steps=$(train_steps stop4); last=${steps##* }
  [ -f "stop4/checkpoints/$(printf 'step_%08d' "$last")/manifest.json" ] || { cat stop4.log; fail "stop4: update $last, its last, has no checkpoint"; }
  end=$((last + 5))
  mpi "$bin" train -c run.json --set output_dir=stop4 --resume --max-updates $end --quiet > resume.log 2>&1 || { cat resume.log; fail "stop4: resume"; }
  mpi "$bin" train -c run.json --set output_dir=straight4 --max-updates $end --quiet > /dev/null 2>&1 || fail "the straight 2-rank run"
  check_resumed stop4 straight4 $end
  echo "preemption: SIGTERM to every process of a 2-rank job under scripts/mpirun_graceful.sh after update $last: both ranks stopped, exit 75 after ${seconds} s, resumed to the straight run's bits"

  # Under the graceful launcher every rank exits 0 and leaves its status to the launcher (mpirun
  # would wait out the grace after a non-zero exit): a finished run 0, a refused config 2, at once.
  for case in "0 --max-updates 3" "2 --set batch.micro_batch=3"; do
    want=${case%% *}
    t0=$(date +%s)
    rc=0; (MULTINORM_MPI_GRACE_S=60 graceful "$bin" train -c run.json --set output_dir=status$want --quiet ${case#* } > status.log 2>&1) || rc=$?
    seconds=$(($(date +%s) - t0))
    [ "$rc" -eq "$want" ] && [ "$seconds" -le 20 ] || { cat status.log; fail "the graceful launcher: exit $rc after $seconds s, expected $want at once"; }
  done
  ls -A | grep -q multinorm-status && fail "the graceful launcher left its status file"
  echo "preemption: scripts/mpirun_graceful.sh passes a finished run's 0 and a refused config's 2 at once"
fi
echo "preemption: passed"
