#!/usr/bin/env bash
# What `tally fuzz --shrink new` buys on a framework with known miscounts: the same campaign (seed,
# time, world) with --shrink all and with --shrink new, side by side. Reports the cases generated,
# the failures, the distinct failure signatures, and the worker's cases per minute (generated plus
# shrink runs).
#
#   bench/shrink_policy_rate.sh TALLY SECONDS OUT WORLD [TARGET]     (TARGET: deepspeed, the default)
#
# Needs the target's framework importable; the adapters are put on PYTHONPATH here.
set -u
tally=${1:?usage: shrink_policy_rate.sh TALLY SECONDS OUT WORLD [TARGET]}
seconds=${2:?seconds per campaign}
out=${3:?output folder}
world=${4:?world}
target=${5:-deepspeed}
here=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$here/adapters${PYTHONPATH:+:$PYTHONPATH}"  # tally_adapters from the checkout
mkdir -p "$out"
echo "target $target, world $world, seed $world, ${seconds} s per campaign, --max-failures 0 (no bound)"
echo "shrink  generated  failures  signatures  shrunk  executed/min"
for policy in all new; do
  "$tally" fuzz --target "$target" --world "$world" --time "${seconds}s" --seed "$world" --max-failures 0 \
    --shrink "$policy" --shrink-time 30s --case-timeout 120s --corpus "$out/corpus-$policy" \
    --worker-dir "$out/worker-$policy" --json >"$out/fuzz-$policy.json" 2>"$out/fuzz-$policy.err"
  python3 - "$out/fuzz-$policy.json" "$policy" <<'PY'
import json, sys
path, policy = sys.argv[1:]
try:
    j = json.load(open(path))
except Exception:
    print(f"{policy:>6}  no summary; see {path[:-5]}.err")
    sys.exit()
failures = j["failures"]
shrunk = [f for f in failures if f.get("shrunk")]
executed = j["cases"] + sum(f.get("shrink_runs", 0) for f in shrunk)
signatures = len({f["failure"] for f in failures})
print(f"{policy:>6}  {j['cases']:>9}  {len(failures):>8}  {signatures:>10}  {len(shrunk):>6}  "
      f"{60 * executed / j['seconds']:12.1f}")
PY
done
