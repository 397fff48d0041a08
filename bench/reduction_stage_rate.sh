#!/usr/bin/env bash
# Cases per minute of a real target with its gradients entering after the framework's reduction
# against before it, side by side in one run: each world-4 fixture of seeds/real that has an
# "-unreduced-" twin is replayed with its twin in one worker, ROUNDS times, the order of each pair
# alternating (after first, then before first), after one warm-up round that is not counted (a
# layout's first case builds its meshes, most of a case's time on gloo). Prints the seconds per case
# of each side (medians), their ratio, and the cases per minute.
#
#   bench/reduction_stage_rate.sh TALLY TARGET ROUNDS
#
# TARGET: torchtitan or automodel (their world-4 fixtures), or megatron-core (its world-4 fixtures
# "-unreduced-", each with its twin made here: the same case without gradients.enter); run in its
# environment (PATH=<venv>/bin:$PATH, adapters installed; for megatron-core, PYTHONPATH with the wheel).
set -euo pipefail
tally=${1:?usage: reduction_stage_rate.sh TALLY TARGET ROUNDS}
target=${2:?torchtitan, automodel or megatron-core}
rounds=${3:?rounds}
here=$(cd "$(dirname "$0")/.." && pwd)
log=$(mktemp)
twins=$(mktemp -d)
trap 'rm -rf "$log" "$twins"' EXIT
if [ "$target" = megatron-core ]; then
  befores=("$here"/seeds/real/megatron-core-*-unreduced-*.pass.json)
  for before in "${befores[@]}"; do
    python3 - "$before" "$twins/$(basename "${before/-unreduced-/-}")" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["gradients"].pop("enter")
c["target"].pop("manifests", None)
json.dump(c, open(sys.argv[2], "w"), indent=2)
PY
  done
else
  befores=("$here"/seeds/real/"$target"-*-unreduced-*world4.pass.json)
fi
cases=()
for ((r = -1; r < rounds; ++r)); do  # round -1: the warm-up
  for before in "${befores[@]}"; do
    after=${before/-unreduced-/-}
    [ -e "$after" ] || after=$twins/$(basename "$after")
    [ -e "$after" ] || continue
    if ((r == -1 || r % 2 == 0)); then cases+=("$after" "$before"); else cases+=("$before" "$after"); fi
  done
done
"$tally" replay "${cases[@]}" --target "$target" --case-timeout 300s >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
python3 - "$log" "$((2 * ${#befores[@]}))" <<'PY'
import re, statistics, sys
seconds = {"after": [], "before": []}
warm_up = int(sys.argv[2])
for line in [l for l in open(sys.argv[1]) if l.startswith("ok ")][warm_up:]:
    m = re.match(r"ok\s+(\S+)\s+\(.*, ([0-9.]+) s\)$", line.strip())
    if m:
        seconds["before" if "-unreduced-" in m.group(1) else "after"].append(float(m.group(2)))
# Medians: a worker that retires (its thread budget) restarts inside whichever case comes next.
a, b = statistics.median(seconds["after"]), statistics.median(seconds["before"])
n = len(seconds["after"])
print(f"{n} cases a side, median seconds a case: after the reduction {a:.3f} ({60 / a:.0f}/min), "
      f"before it {b:.3f} ({60 / b:.0f}/min); before/after {b / a:.2f}")
PY
