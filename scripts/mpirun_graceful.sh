#!/usr/bin/env bash
# Open MPI's mpirun for a multinorm run that a job scheduler may stop: SIGTERM or SIGINT to this
# launcher (SLURM's preemption or scancel, Ctrl-C), or SIGTERM to every process of the job at once
# (as SLURM sends it), stops every rank after the update in flight, with its checkpoint, and this
# exits with status 75, as SIGUSR1 does (docs/training.md, "Stopping a run").
#
#   bash scripts/mpirun_graceful.sh -np 8 build/multinorm train -c RUN.json --resume
#
# Why each piece:
#  - On SIGTERM or SIGINT mpirun itself ends its ranks (SIGTERM, then SIGKILL 1 s later: the update
#    in flight and its checkpoint lost), while SIGUSR1 it forwards to every rank. So the first
#    SIGTERM or SIGINT this launcher gets goes to mpirun as SIGUSR1; a second SIGINT is passed on as
#    it is (Ctrl-C twice: now).
#  - Where the scheduler signals mpirun too, each rank takes its own SIGTERM; Open MPI is told to
#    wait MULTINORM_MPI_GRACE_S seconds (default 60) before it signals the ranks, and as long again
#    before SIGKILL (odls_base_sigkill_timeout), while they finish their update and checkpoint. Give
#    the scheduler a kill wait at least as long (SLURM: KillWait; --signal for time limits).
#  - That wait also follows a rank's non-zero exit (mpirun then aborts the job), so under this
#    launcher every rank exits 0 and leaves its status in MULTINORM_STATUS_FILE (a file in the
#    working directory, which a cluster shares between its nodes, else in TMPDIR); this exits with
#    the first non-zero status there, else with mpirun's. An error that ends every rank at once
#    (multinorm calls MPI_Abort) or a crash still waits out the grace.
#
# Environment: MULTINORM_MPIRUN (the launcher; default mpirun), MULTINORM_MPI_GRACE_S.
set -u
launcher=${MULTINORM_MPIRUN:-mpirun}
export OMPI_MCA_odls_base_sigkill_timeout=${MULTINORM_MPI_GRACE_S:-60}
MULTINORM_STATUS_FILE=$(mktemp "$PWD/.multinorm-status.XXXXXX" 2>/dev/null || mktemp "${TMPDIR:-/tmp}/multinorm-status.XXXXXX") || exit 1
export MULTINORM_STATUS_FILE
trap 'rm -f "$MULTINORM_STATUS_FILE"' EXIT
"$launcher" -x MULTINORM_STATUS_FILE "$@" &
pid=$!
stopping=0
stop() {  # SIGNAL: the first SIGTERM or SIGINT asks every rank to stop; a second SIGINT is passed on
  if [ "$1" = INT ] && [ "$stopping" = 1 ]; then kill -INT "$pid" 2>/dev/null; return; fi
  stopping=1
  kill -USR1 "$pid" 2>/dev/null
}
trap 'stop TERM' TERM
trap 'stop INT' INT
trap 'kill -USR1 "$pid" 2>/dev/null' USR1
# `wait` returns early when a trapped signal arrives: wait again while the launcher runs.
rc=0
while kill -0 "$pid" 2>/dev/null; do
  wait "$pid"
  rc=$?
done
wait "$pid" 2>/dev/null
last=$?
[ "$last" -ne 127 ] && rc=$last  # 127: its status was the one already read
ranks=$(grep -m1 -vx 0 "$MULTINORM_STATUS_FILE" 2>/dev/null)
exit "${ranks:-$rc}"
