#!/usr/bin/env bash
# scripts/slurm/{train,sweep}.sbatch run as SLURM runs a batch job (a copy of the script in a spool
# folder, started in the submission folder with SLURM's variables, a stand-in scontrol that records
# its arguments) and stopped as SLURM stops one:
#   - train.sbatch, 2 MPI ranks: SIGUSR1 to the batch shell (the time limit's --signal=B:USR1@120):
#     requeue asked with the job's id, exit 0; SIGTERM to every process of the job (a preemption,
#     scancel), the requeue refused: exit 75. After each, the run's last update has its checkpoint and
#     the next start resumes it (every update's metrics line once); finished, the job ends 0 without
#     a requeue; a refused config ends 2 without one;
#   - sweep.sbatch, 2 runs on the job's 2 GPUs: the same two stops (both requeued, exit 0), the sweep
#     passing the stop to each run, which stops with its last update's checkpoint, and ending 75; the third start finishes both runs (every update's
#     metrics line once) and the summary, exit 0, no requeue; runs of 2 GPUs (2 ranks each, through
#     the graceful launcher): SIGTERM to every process stops the run in flight with its checkpoint,
#     no rank killed, requeued; the next start finishes both runs.
# usage: slurm_scripts.sh <multinorm binary> [mpirun]   (without mpirun: the sweep of 1-GPU runs only)
set -uo pipefail
bin=$(realpath "$1") mpirun=${2:-}
src=$(realpath "$(dirname "$0")/..")
source "$(dirname "$0")/fixtures/long_run.sh"
# The submission folder stands for the repository's root (build/multinorm, scripts/), where the
# scripts find the binary and the launcher by default; sbatch runs a copy from its spool folder.
mkdir -p build spool
ln -s "$bin" build/multinorm
ln -s "$src/scripts" scripts
cp "$src"/scripts/slurm/{train,sweep}.sbatch spool/
printf '#!/bin/sh\necho "$*" >> %s/requeues\n[ ! -e %s/refuse ]\n' "$tmp" "$tmp" > scontrol
chmod +x scontrol
touch requeues
jobid=9$$ node=$(hostname)
# start SCRIPT START_COUNT ARGS...: the batch job in the background (its shell's pid in $job), log in job.log
start() {
  local script=$1 count=$2
  shift 2
  env -u CUDA_VISIBLE_DEVICES SLURM_JOB_ID="$jobid" SLURM_JOBID="$jobid" SLURM_JOB_NAME=multinorm SLURM_RESTART_COUNT="$count" \
    SLURM_SUBMIT_DIR="$tmp" SLURM_NTASKS=2 SLURM_NPROCS=2 SLURM_NNODES=1 SLURM_JOB_NUM_NODES=1 SLURM_NODELIST="$node" \
    SLURM_JOB_NODELIST="$node" SLURM_TASKS_PER_NODE=2 SLURM_GPUS_ON_NODE=2 \
    MULTINORM_MPIRUN="$mpirun" MULTINORM_MPIRUN_ARGS="--oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1" \
    MULTINORM_MPI_GRACE_S=5 MULTINORM_SCONTROL="$tmp/scontrol" bash "spool/$script" "$@" > job.log 2>&1 &
  job=$!
}
finish() {  # the job's exit status in $rc
  rc=0; wait "$job" || rc=$?
}
# every process of the job, as SLURM finds them: those with its SLURM_JOB_ID
job_processes() { grep -lsxz "SLURM_JOB_ID=$jobid" /proc/[0-9]*/environ | cut -d/ -f3; }
updates() { local n; n=$(grep -c '"type": *"train"' "$1/metrics.jsonl" 2>/dev/null); echo "${n:-0}"; }
wait_for_updates() {  # RUN_DIR N: until N train lines are written (up to 120 s)
  for _ in $(seq 1200); do
    [ "$(updates "$1")" -ge "$2" ] && return
    kill -0 "$job" 2>/dev/null || { cat job.log; fail "the job ended before $1 wrote $2 updates"; }
    sleep 0.1
  done
  fail "$1 wrote no $2 updates"
}
# check_stop WHAT RC WANT_RC REQUEUES RUN_DIR...: the job's status, the requeues asked (each with the
# job's id), and each run stopped after an update with its checkpoint, every update's line once
check_stop() {
  local what=$1 rc=$2 want=$3 n=$4 d steps last
  shift 4
  [ "$rc" -eq "$want" ] || { cat job.log; fail "$what: the job ended $rc, expected $want"; }
  [ "$(wc -l < requeues)" -eq "$n" ] && [ "$(sort -u requeues)" = "requeue $jobid" ] || { cat requeues; fail "$what: expected $n requeue(s) of job $jobid"; }
  for d in "$@"; do
    steps=$(train_steps "$d"); last=${steps##* }
    [ "$steps" = "$(seq -s ' ' 1 "$last")" ] || fail "$what: $d's metrics steps: $steps"
    [ -f "$d/checkpoints/$(printf 'step_%08d' "$last")/model.safetensors" ] || fail "$what: $d's last update, $last, has no checkpoint"
    [ ! -e "$d/result.json" ] || fail "$what: $d finished before the stop"
  done
}

if [ -n "$mpirun" ]; then
  # 1. The time limit's SIGUSR1 to the batch shell: the ranks stop, the job requeues itself.
  start train.sbatch 0 run.json --set output_dir=runs/train
  wait_for_updates runs/train 3
  kill -USR1 "$job"
  finish
  check_stop "train.sbatch, SIGUSR1" "$rc" 0 1 runs/train
  grep -q "stopped by SIGUSR1 after update $(updates runs/train)" job.log || { cat job.log; fail "train.sbatch: no stop after the last update in the log"; }
  grep -q "train.sbatch: job $jobid, start 0" job.log || { cat job.log; fail "train.sbatch: no start line"; }
  echo "slurm_scripts: train.sbatch, SIGUSR1 to the batch shell: stopped after update $(updates runs/train) with its checkpoint, requeued, exit 0"

  # 2. SIGTERM to every process of the job (the batch shell, the launcher, mpirun, the ranks), the
  # requeue refused: the ranks stop within the launcher's grace, the job ends 75.
  before=$(updates runs/train)
  start train.sbatch 1 run.json --set output_dir=runs/train
  wait_for_updates runs/train $((before + 3))
  pids=$(job_processes)
  [ "$(wc -w <<<"$pids")" -ge 5 ] || fail "train.sbatch: expected the batch shell, the launcher, mpirun and 2 ranks, found pids $pids"
  touch refuse
  t0=$(date +%s)
  kill -TERM $pids
  finish
  seconds=$(($(date +%s) - t0))
  rm refuse
  check_stop "train.sbatch, SIGTERM to the job, the requeue refused" "$rc" 75 2 runs/train
  [ "$seconds" -le 30 ] || fail "train.sbatch: the job took $seconds s to stop"
  grep -q "terminated by signal\|Killed\|MPI_ABORT" job.log && { cat job.log; fail "train.sbatch: a rank was killed"; }
  grep -q "requeue was refused" job.log || { cat job.log; fail "train.sbatch: the refused requeue is not said"; }
  echo "slurm_scripts: train.sbatch, SIGTERM to its $(wc -w <<<"$pids") processes: resumed from update $before, stopped after $(updates runs/train), requeue refused, exit 75 after $seconds s"

  # 3. The next start finishes the run (--max-updates, passed on to train): status 0, no requeue.
  end=$(($(updates runs/train) + 5))
  start train.sbatch 2 run.json --set output_dir=runs/train --max-updates $end
  finish
  [ "$rc" -eq 0 ] || { cat job.log; fail "train.sbatch: the last start ended $rc"; }
  [ "$(train_steps runs/train)" = "$(seq -s ' ' 1 $end)" ] || fail "train.sbatch: metrics steps after the resume: $(train_steps runs/train)"
  [ "$(wc -l < requeues)" -eq 2 ] || fail "train.sbatch: a finished run asked for a requeue"
  # A refused config: its status, no requeue.
  start train.sbatch 0 run.json --set output_dir=runs/bad --set batch.micro_batch=3
  finish
  [ "$rc" -eq 2 ] && [ "$(wc -l < requeues)" -eq 2 ] || { cat job.log; fail "train.sbatch, a refused config: exit $rc, expected 2, no requeue"; }
  echo "slurm_scripts: train.sbatch: the third start resumed to update $end and ended 0; a refused config 2; neither requeued"
fi

# The sweep: 2 runs of 1000 updates, one per GPU of the job (SLURM_GPUS_ON_NODE=2).
cat > sweep.json <<'JSON'
{"base": "run.json", "output_dir": "runs/sweep", "set": {"schedule.total_steps": 1000},
 "runs": [{"name": "a", "set": {"seed": 1}}, {"name": "b", "set": {"seed": 2}}]}
JSON
: > requeues
start sweep.sbatch 0 sweep.json
wait_for_updates runs/sweep/a 3
wait_for_updates runs/sweep/b 3
kill -USR1 "$job"
finish
check_stop "sweep.sbatch, SIGUSR1" "$rc" 0 1 runs/sweep/a runs/sweep/b
for r in a b; do
  grep -q "stopped by SIGUSR1 after .*checkpoints/$(printf 'step_%08d' "$(updates runs/sweep/$r)")" runs/sweep/$r/train.log ||
    { cat runs/sweep/$r/train.log; fail "sweep.sbatch: run $r not stopped by SIGUSR1 after its last update"; }
done
grep -q "^sweep: starting a on GPU 0$" job.log && grep -q "^sweep: starting b on GPU 1$" job.log || { cat job.log; fail "sweep.sbatch: the runs are not on GPUs 0 and 1"; }
# The sweep itself passed the stop on, counted both runs stopped (not failed) and ended 75.
grep -q "sweep stopped by SIGUSR1: 2 run(s) stopped with their checkpoints" job.log &&
  grep -q "sweep: a stopped with its checkpoint" job.log && grep -q "the sweep ended with status 75 after SIGUSR1" job.log ||
  { cat job.log; fail "sweep.sbatch: the sweep did not stop its runs and end 75"; }
echo "slurm_scripts: sweep.sbatch, SIGUSR1 to the batch shell: both runs stopped with their checkpoints (updates $(updates runs/sweep/a), $(updates runs/sweep/b)), requeued, exit 0"

a=$(updates runs/sweep/a) b=$(updates runs/sweep/b)
start sweep.sbatch 1 sweep.json
wait_for_updates runs/sweep/a $((a + 3))
wait_for_updates runs/sweep/b $((b + 3))
pids=$(job_processes)
[ "$(wc -w <<<"$pids")" -ge 4 ] || fail "sweep.sbatch: expected the batch shell, the sweep and 2 runs, found pids $pids"
kill -TERM $pids
finish
check_stop "sweep.sbatch, SIGTERM to the job" "$rc" 0 2 runs/sweep/a runs/sweep/b
echo "slurm_scripts: sweep.sbatch, SIGTERM to its $(wc -w <<<"$pids") processes: both runs resumed and stopped with their checkpoints (updates $(updates runs/sweep/a), $(updates runs/sweep/b)), requeued, exit 0"

start sweep.sbatch 2 sweep.json
finish
[ "$rc" -eq 0 ] || { cat job.log; fail "sweep.sbatch: the last start ended $rc"; }
for r in a b; do
  [ -f runs/sweep/$r/result.json ] || fail "sweep.sbatch: run $r did not finish"
  [ "$(train_steps runs/sweep/$r)" = "$(seq -s ' ' 1 1000)" ] || fail "sweep.sbatch: run $r's metrics steps are not 1 to 1000 once each"
done
[ -f runs/sweep/summary.md ] || { cat job.log; fail "sweep.sbatch: no summary"; }
[ "$(wc -l < requeues)" -eq 2 ] || fail "sweep.sbatch: a finished sweep asked for a requeue"
echo "slurm_scripts: sweep.sbatch: the third start finished both runs and the summary, exit 0, no requeue"

if [ -n "$mpirun" ]; then
  # Runs of 2 GPUs (2 ranks under the sweep's --mpirun, the graceful launcher): SIGTERM to every
  # process of the job stops the ranks of the run in flight with its checkpoint, none killed.
  sed 's|runs/sweep|runs/sweep2|; s|1000|500|' sweep.json > sweep2.json
  : > requeues
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  start sweep.sbatch 0 sweep2.json --gpus-per-run 2
  wait_for_updates runs/sweep2/a 3
  pids=$(job_processes)
  [ "$(wc -w <<<"$pids")" -ge 6 ] || fail "sweep.sbatch --gpus-per-run 2: expected the batch shell, the sweep, the launcher, mpirun and 2 ranks, found pids $pids"
  kill -TERM $pids
  finish
  check_stop "sweep.sbatch --gpus-per-run 2, SIGTERM to the job" "$rc" 0 1 runs/sweep2/a
  grep -q "terminated by signal\|Killed\|MPI_ABORT" runs/sweep2/a/train.log && { cat runs/sweep2/a/train.log; fail "sweep.sbatch --gpus-per-run 2: a rank was killed"; }
  stopped=$(updates runs/sweep2/a)
  start sweep.sbatch 1 sweep2.json --gpus-per-run 2
  finish
  [ "$rc" -eq 0 ] && [ "$(wc -l < requeues)" -eq 1 ] || { cat job.log; fail "sweep.sbatch --gpus-per-run 2: the second start ended $rc"; }
  for r in a b; do
    [ "$(train_steps runs/sweep2/$r)" = "$(seq -s ' ' 1 500)" ] || fail "sweep.sbatch --gpus-per-run 2: run $r's metrics steps are not 1 to 500 once each"
  done
  grep -q "^sweep: starting a on GPU 0,1 (.*mpirun_graceful.sh -np 2)$" job.log || { cat job.log; fail "sweep.sbatch: the runs of 2 GPUs are not launched through the graceful launcher"; }
  echo "slurm_scripts: sweep.sbatch --gpus-per-run 2, SIGTERM to its $(wc -w <<<"$pids") processes: the 2 ranks of run a stopped after update $stopped with its checkpoint, requeued, exit 0; the next start finished both runs"
fi
echo "slurm_scripts: passed"
