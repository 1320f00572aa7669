#!/usr/bin/env bash
# benchmarks.device_check on a lent GPU under a hard cap of 470 s (BUILD.md, "GPU check").
#
#   bash benchmarks/device_check.sh [OUT_DIR [--config.<field>=value ...]]
#
# Installs nothing: run it where the project's packages import (BUILD.md says which to carry).
# OUT_DIR (default docs/results/device_check; a relative one is under the repository root) gets
# device_check.json, rewritten after every stage so that a run stopped at the cap keeps the
# stages it finished, and device_check.flags / .config.json. The stages (CSD's fit and inference
# against ENS(15), the test files that touch devices, VizDoom's paper setting) keep their own
# budgets inside the cap.
set -u
cd "$(dirname "$0")/.." || exit 1
out_dir=${1:-docs/results/device_check}
[ $# -gt 0 ] && shift
python=${PYTHON:-$(command -v python3 || command -v python)}
export PYTHONUNBUFFERED=1
timeout -k 10 470 "$python" -m benchmarks.device_check --out_dir="$out_dir" "$@"
status=$?
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
  echo "device_check: stopped at the 470 s cap; $out_dir/device_check.json holds the stages" \
       "that finished" >&2
fi
exit "$status"
