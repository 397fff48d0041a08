#!/usr/bin/env bash
# Two tally binaries on the same model-target campaign (seed, cases), side by side in one run, so a
# regression in cases per second shows as a ratio rather than as two numbers from two days.
#
#   bench/compare_binaries.sh BASELINE CANDIDATE [SEED] [CASES] [ROUNDS]
#
# Defaults: seed 5, 60000 cases (the default campaign of issue 34), 3 rounds. The binaries run
# alternately (baseline, candidate, baseline, ...) so a load that comes and goes hits both; each
# line is one campaign, then the best and median rate of each and the ratio candidate / baseline
# of the medians. With TALLY_BENCH_CALLGRIND=N (N cases, e.g. 3000) it also counts each binary's
# instructions on the first N cases under valgrind --tool=callgrind: a count that a busy machine
# does not move (valgrind is slow: about 10 s per 1000 cases).
#
# Two binaries of different versions generate different cases from one seed when their generators
# differ: the ratio then compares the campaigns each would run, which is what a nightly sees.
# TALLY_BENCH_BASELINE_ARGS and TALLY_BENCH_CANDIDATE_ARGS add flags to one side's campaigns (e.g.
# "--jobs 1": one core each, where a binary runs cases side by side by default).
set -euo pipefail
baseline=${1:?usage: compare_binaries.sh BASELINE CANDIDATE [SEED] [CASES] [ROUNDS]}
candidate=${2:?usage: compare_binaries.sh BASELINE CANDIDATE [SEED] [CASES] [ROUNDS]}
seed=${3:-5}
cases=${4:-60000}
rounds=${5:-3}
for binary in "$baseline" "$candidate"; do
  [ -x "$binary" ] || { echo "compare_binaries.sh: $binary is not an executable file" >&2; exit 2; }
done
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# One campaign's cases per second, from the JSON summary (cases / seconds).
read -r -a baseline_args <<<"${TALLY_BENCH_BASELINE_ARGS:-}"
read -r -a candidate_args <<<"${TALLY_BENCH_CANDIDATE_ARGS:-}"
rate() {
  local binary=$1
  shift
  "$binary" fuzz --seed "$seed" --cases "$cases" --corpus "$scratch/corpus" --json "$@" >"$scratch/out.json"
  python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print(round(j["cases"] / j["seconds"]))' "$scratch/out.json"
}

echo "tally fuzz --seed $seed --cases $cases, $rounds rounds, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" \
  "${TALLY_BENCH_BASELINE_ARGS:+, baseline $TALLY_BENCH_BASELINE_ARGS}${TALLY_BENCH_CANDIDATE_ARGS:+, candidate $TALLY_BENCH_CANDIDATE_ARGS}"
declare -a base_rates cand_rates
for ((round = 1; round <= rounds; ++round)); do
  b=$(rate "$baseline" "${baseline_args[@]}")
  c=$(rate "$candidate" "${candidate_args[@]}")
  base_rates+=("$b")
  cand_rates+=("$c")
  echo "round $round: baseline $b cases/s, candidate $c cases/s"
done
python3 - "${base_rates[*]}" "${cand_rates[*]}" "$baseline" "$candidate" <<'PY'
import statistics, sys
base = [float(x) for x in sys.argv[1].split()]
cand = [float(x) for x in sys.argv[2].split()]
for name, rates, path in (("baseline", base, sys.argv[3]), ("candidate", cand, sys.argv[4])):
    print(f"{name:>9}: best {max(rates):.0f}, median {statistics.median(rates):.0f} cases/s  ({path})")
print(f"ratio candidate / baseline (medians): {statistics.median(cand) / statistics.median(base):.2f}")
PY

if [ -n "${TALLY_BENCH_CALLGRIND:-}" ]; then
  command -v valgrind >/dev/null || { echo "compare_binaries.sh: TALLY_BENCH_CALLGRIND needs valgrind" >&2; exit 2; }
  declare -a counts
  for binary in "$baseline" "$candidate"; do
    valgrind --tool=callgrind --callgrind-out-file="$scratch/cg.out" "$binary" fuzz --seed "$seed" \
      --cases "$TALLY_BENCH_CALLGRIND" --corpus "$scratch/corpus" >/dev/null 2>"$scratch/cg.log"
    counts+=("$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$scratch/cg.log")")
  done
  python3 - "${counts[0]}" "${counts[1]}" "$TALLY_BENCH_CALLGRIND" <<'PY'
import sys
base, cand, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
print(f"instructions per case on the first {n} cases: baseline {base / n:,.0f}, candidate {cand / n:,.0f}, "
      f"ratio {cand / base:.2f}")
PY
fi
