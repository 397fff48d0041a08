#!/usr/bin/env bash
# A real target's sweep rate, variants one after another in one run: each variant sweeps the same
# world from its first case for SECONDS (then SIGINT, as a user stops a sweep; the state file the
# sweep rewrites every two seconds says what it ran), so the variants run the same cases.
#
#   bench/real_sweep_rate.sh TALLY TARGET WORLD SECONDS OUT NAME:JOBS:ADAPTERS [NAME:JOBS:ADAPTERS...]
#
# NAME labels the variant (its folder under OUT), JOBS is `tally sweep --jobs` (lanes side by side,
# a worker of the world each), ADAPTERS the folder whose tally_adapters the workers import (this
# checkout's adapters/, or an older copy to time a change against). Environment variables the
# variant needs (PYTHONPATH entries of the framework, TALLY_SWEEP_WORKER: a --worker command) are
# the caller's. Prints one row per variant: cases, cases a minute, outcomes, and the ratio to the
# first variant's rate. The rate is the cases the state holds over SECONDS, the workers' start
# included (the cases a lane finishes while it winds down after SIGINT count too: a case or two).
set -u
usage="usage: real_sweep_rate.sh TALLY TARGET WORLD SECONDS OUT NAME:JOBS:ADAPTERS..."
tally=${1:?$usage}
target=${2:?$usage}
world=${3:?$usage}
seconds=${4:?$usage}
out=${5:?$usage}
shift 5
[ $# -gt 0 ] || { echo "$usage" >&2; exit 2; }
mkdir -p "$out"
rows=()
first_rate=""
for variant in "$@"; do
  IFS=: read -r name jobs adapters <<<"$variant"
  if [ -z "$name" ] || ! [[ $jobs =~ ^[1-9][0-9]*$ ]] || [ ! -d "$adapters/tally_adapters" ]; then
    echo "real_sweep_rate.sh: variant '$variant' is not NAME:JOBS:ADAPTERS with a number of lanes and a folder holding tally_adapters" >&2
    exit 2
  fi
  dir="$out/$name"
  rm -rf "$dir"
  mkdir -p "$dir"
  worker=()
  [ -n "${TALLY_SWEEP_WORKER:-}" ] && worker=(--worker "${TALLY_SWEEP_WORKER//\{out\}/$dir}")
  PYTHONPATH="$adapters${PYTHONPATH:+:$PYTHONPATH}" timeout -s INT -k 60 "$seconds" \
    "$tally" sweep --target "$target" --world "$world" --jobs "$jobs" --corpus "$dir/corpus" \
    --state "$dir/state.json" --worker-dir "$dir/workers" "${worker[@]}" >"$dir/sweep.log" 2>&1
  rc=$?
  row=$(python3 - "$dir/state.json" "$name" "$jobs" "$seconds" "$rc" "$first_rate" 2>"$dir/rate" <<'PY'
import collections, json, sys
path, name, jobs, wall, rc, first = sys.argv[1:]
try:
    results = json.load(open(path))["results"]
except Exception as e:
    print(f"{name}: no state ({e}); exit {rc}")
    sys.exit()
rate = 60 * len(results) / float(wall)
outcomes = collections.Counter(r["outcome"] for r in results)
ratio = f"{rate / float(first):5.2f}x" if first else "1.00x"
print(f"{name:<24} {jobs:>4} lanes {len(results):>6} cases in {float(wall):6.1f} s  {rate:7.1f} a minute  {ratio}  "
      + " ".join(f"{k} {v}" for k, v in sorted(outcomes.items())) + f"  (exit {rc})")
print(f"RATE {rate}", file=sys.stderr)
PY
)
  rows+=("$row")
  [ -z "$first_rate" ] && first_rate=$(sed -n 's/^RATE //p' "$dir/rate")
done
echo "tally sweep --target $target --world $world, $seconds s a variant, from the first case"
printf '%s\n' "${rows[@]}"
