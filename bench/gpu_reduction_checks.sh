#!/usr/bin/env bash
# The GPU step issue 49 still waits for, as one script (megatron-core 0.19.2 installed, its worker
# importable: PYTHONPATH with the wheel and adapters/). Side by side, within about five minutes on one
# H100 or H200 over gloo:
#   1. the two saved runs of docs/findings/megatron-core-0.19.2-dist-opt-instances-split-their-shards.md
#      again with their gradients before megatron-core's reduction, saved with their manifests
#      (`--expect observed`): the finding's first symptom as tally sees it (held-gradients), for the
#      finding file's saved_runs, so the known matcher files such failures under it;
#   2. the worker's four reduction plants through `tally mutants` at world 4;
#   3. a world-4 campaign with half its cases before the reduction.
#
#   bench/gpu_reduction_checks.sh TALLY OUTDIR
set -u
tally=${1:?usage: gpu_reduction_checks.sh TALLY OUTDIR}
out=${2:?usage: gpu_reduction_checks.sh TALLY OUTDIR}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out/saved"
cases=$(mktemp -d)
trap 'rm -rf "$cases"' EXIT
for name in dist-opt-instances-split-their-shards dist-opt-instances-split-their-shards-moe; do
  python3 - "$here/seeds/real/megatron-core-0.19.2-$name.fail.json" "$cases/$name.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
for key in ("target", "expect", "tool", "description"):
    c.pop(key, None)
c["gradients"]["enter"] = "before_reduction"
json.dump(c, open(sys.argv[2], "w"), indent=2)
PY
  ( timeout 250 "$tally" run --target megatron-core "$cases/$name.json" --case-timeout 200s \
      --save "$out/saved/megatron-core-0.19.2-$name-unreduced.fail.json" --expect observed \
      --description "megatron-core 0.19.2's distributed optimizer with 2 instances outside Megatron-LM's two orders, the gradients before its own reduction: the dense gradients reduced over the wrong ranks (held-gradients) and the norm over the wrong stats group" \
      >"$out/saved/$name.txt" 2>&1; echo "rc=$?" >>"$out/saved/$name.txt" ) &
done
( timeout 260 "$tally" mutants --target megatron-core --world 4 --budget 20 --case-timeout 100s \
    --faults tied-embedding-not-synced,tied-embedding-synced-twice,tp-replicated-grads-not-summed,tp-replicated-grads-summed-twice \
    --corpus "$out/mutants" >"$out/mutants.txt" 2>&1; echo "rc=$?" >>"$out/mutants.txt" ) &
( timeout 260 "$tally" fuzz --target megatron-core --world 4 --time 180s --seed 4907 --corpus "$out/campaign4" \
    --known "$here/seeds/real" --shrink-runs 0 --case-timeout 120s >"$out/campaign4.txt" 2>&1
  echo "rc=$?" >>"$out/campaign4.txt" ) &
wait
for name in dist-opt-instances-split-their-shards dist-opt-instances-split-their-shards-moe; do
  tail -22 "$out/saved/$name.txt"
done
tail -12 "$out/mutants.txt"
tail -14 "$out/campaign4.txt"
