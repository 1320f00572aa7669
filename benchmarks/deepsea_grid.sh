#!/usr/bin/env bash
# The 10-seed DeepSea grid, one cell (agent x size, its seeds vmapped as one program) at a time,
# under a wall-clock cap, so that a GPU lent for a few minutes finishes what it can and a later
# call goes on from there:
#
#   bash benchmarks/deepsea_grid.sh GRID_DIR CAP_S [agent:size ...] [-- --config.<field>=v ...]
#
# GRID_DIR holds the grid (benchmarks.exploration's folders). A cell whose seeds all finished
# before is skipped by the grid itself; one cut by the cap leaves no summary and runs again from
# its start next time (its seeds are one program: there is no per-seed resume mid-cell). A cell
# starts only while CAP_S minus the time spent is at least LAST_CELL_S (default 240 s), and runs
# under `timeout` for the time left. At the end the report covers every cell asked for (missing
# ones listed), and GRID_DIR.tgz packs the grid's small files (no checkpoints, no TensorBoard
# events), so a lent machine's $OUT brings back one file.
# Default cells, most telling first: the paper's agent and BDQN+P at N = 40 and 50, then N = 30,
# then RND and DQN.
set -u
cd "$(dirname "$0")/.." || exit 1
if [ $# -lt 2 ]; then
  echo "usage: bash benchmarks/deepsea_grid.sh GRID_DIR CAP_S [agent:size ...] [-- flags]" >&2
  exit 2
fi
grid=$1 cap=$2
shift 2
cells=() extra=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; extra=("$@"); break; fi
  cells+=("$1"); shift
done
[ ${#cells[@]} -eq 0 ] && cells=(csd_sa:40 bdqn:40 csd_sa:50 bdqn:50 csd_sa:30 bdqn:30
  rnd_sa:40 dqn:40 rnd_sa:50 dqn:50 rnd_sa:30 dqn:30)
python=${PYTHON:-$(command -v python3 || command -v python)}
seeds=${SEEDS:-10} episodes=${MAX_EPISODES:-10000} last=${LAST_CELL_S:-240}
export PYTHONUNBUFFERED=1
start=$(date +%s)
# a seed runs until bsuite's learning time (rl.records.bsuite_learned_episode: it counts
# successes after the first) or its full budget; a vmapped cell runs as long as its slowest seed
grid_flags=(--config.seeds="$seeds" --config.max_episodes="$episodes" --config.checkpoint_every=0
  --config.stop_after_solved_episodes=-1 --config.stop_when_learned=True)
agents=() sizes=()
for cell in "${cells[@]}"; do
  IFS=: read -r agent size <<< "$cell"
  agents+=("$agent") sizes+=("$size")
  left=$((cap - ($(date +%s) - start)))
  if [ "$left" -lt "$last" ]; then
    echo "deepsea_grid: $cell not started ($left s left of $cap)" >&2
    continue
  fi
  echo "deepsea_grid: $cell ($left s left)" >&2
  timeout -k 10 "$left" "$python" -m benchmarks.exploration --config.agents="$agent" \
    --config.sizes="$size" "${grid_flags[@]}" "${extra[@]}" --out_dir="$grid" \
    > "$grid.$agent.$size.log" 2>&1 || echo "deepsea_grid: $cell stopped (status $?)" >&2
done
uniq_list() { printf '%s\n' "$@" | awk '!seen[$0]++' | paste -sd, -; }
"$python" -m benchmarks.exploration --config.agents="$(uniq_list "${agents[@]}")" \
  --config.sizes="$(uniq_list "${sizes[@]}")" "${grid_flags[@]}" "${extra[@]}" \
  --config.report_only=True --out_dir="$grid" > "$grid.report.log" 2>&1
tar czf "$grid.tgz" --exclude=checkpoints --exclude=tb "$grid" "$grid".*.log
echo "deepsea_grid: wrote $grid.tgz ($(($(date +%s) - start)) s)" >&2
