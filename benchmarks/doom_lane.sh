#!/bin/bash
# Long VizDoom runs of benchmarks.exploration, one after another, each resumable from its 50k-step
# checkpoints. Run two at once on a 2-core machine, each from its own `setsid nohup`:
#
#   [TOTAL=1000000] [OUT=out/doom5/<variant>] [EXTRA="--config.runs.csd_sa.bonus.coef=1e-4"] \
#     [AFTER=<pid>] bash benchmarks/doom_lane.sh <variant>:<agent>:<seed> ...
#
# AFTER: start once process <pid> (e.g. another lane's bash) has exited.
# Each run logs to OUT/<agent>_<variant>_seed<seed>.lane.log; starts and ends go to
# out/doom5/lanes.log. Runs yield the CPU to everything else (nice 19 in their own scheduler
# autogroup: setsid starts a new autogroup, inside which nice alone is relative) and keep XLA to
# one thread.
set -u
cd "$(dirname "$0")/.."
echo 19 > /proc/self/autogroup 2>/dev/null || true
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
mkdir -p out/doom5
while [ -n "${AFTER:-}" ] && kill -0 "$AFTER" 2>/dev/null; do sleep 30; done
for job in "$@"; do
  IFS=: read -r variant agent seed <<< "$job"
  out=${OUT:-out/doom5/$variant}
  mkdir -p "$out"
  log=$out/${agent}_${variant}_seed${seed}.lane.log
  echo "$(date -u +%FT%TZ) start $job $out ${EXTRA:-}" >> out/doom5/lanes.log
  # shellcheck disable=SC2086  # EXTRA holds several flags
  nice -n 19 python -m benchmarks.exploration --config=configs/exploration.py:vizdoom,cpu \
    --config.variant="$variant" --config.agents="$agent" --config.first_seed="$seed" \
    --config.seeds=1 --config.total_steps="${TOTAL:-500000}" --config.max_episodes=0 \
    --config.stop_after_solved_episodes=-1 --config.checkpoint_every=50000 \
    --config.log_every=20000 ${EXTRA:-} --out_dir="$out" >> "$log" 2>&1
  echo "$(date -u +%FT%TZ) end $job rc=$?" >> out/doom5/lanes.log
done
