#!/usr/bin/env bash
# A shard of megatron-core's world-8 sweep against the known findings, on a GPU machine (issue 64:
# a night that pages only for new bugs). Run from the repository root there, with megatron-core
# 0.19.2's and emerging-optimizers 0.3.0's wheels in .whl/ (downloaded here with --python-version
# 3.12) and a CPU-only tally built here and carried (docs: bench/RESULTS.md):
#
#   bench/gpu_known_sweep.sh TALLY OUT SHARD SECONDS [JOBS]
#
# Sweeps shard SHARD (I/N: the layouts l with l mod N = I) for at most SECONDS (then SIGINT: the
# state says what ran), JOBS lanes (default 4), then leaves in OUT the sweep's log, its state, and
# new.tgz: the case files and manifests of every new failure and infrastructure error.
set -u
usage="usage: gpu_known_sweep.sh TALLY OUT SHARD SECONDS [JOBS]"
tally=${1:?$usage}; out=${2:?$usage}; shard=${3:?$usage}; seconds=${4:?$usage}; jobs=${5:-4}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
  { echo "gpu_known_sweep.sh: the wheels in .whl/ did not install" >&2; exit 3; }
export PYTHONPATH=/tmp/site:$PWD/adapters OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
# A folder of the shard's own: a warm machine keeps /tmp between calls, and an earlier shard's state
# must not count in this one's new.tgz (the same shard run again on it resumes from its state).
corpus=/tmp/known-sweep-${shard//\//-of-}
start=$(date +%s)
timeout -s INT -k 90 "$seconds" "$tally" sweep --target megatron-core --world 8 --jobs "$jobs" --shard "$shard" \
  --corpus "$corpus" --known seeds/real >"$out/sweep.log" 2>&1
rc=$?
echo "gpu_known_sweep.sh: exit $rc after $(( $(date +%s) - start )) s" >>"$out/sweep.log"
cp "$corpus"/sweep-state*.json "$out/" 2>/dev/null
# The evidence of what is new: each such case file with its manifests.
python3 - "$corpus" "$out/new.list" <<'PY'
import glob, json, os, sys
corpus, listing = sys.argv[1:]
files = []
for state in glob.glob(os.path.join(corpus, "sweep-state*.json")):
    for r in json.load(open(state))["results"]:
        if ((r["outcome"] == "fail" and not r.get("known")) or r["outcome"] == "infra-error") and r.get("case_file"):
            files.append(os.path.relpath(r["case_file"], corpus))
            manifests = r["case_file"][: -len(".json")] + ".manifests"
            if os.path.isdir(manifests):
                files.append(os.path.relpath(manifests, corpus))
open(listing, "w").write("\n".join(files[:400]) + ("\n" if files else ""))
PY
[ -s "$out/new.list" ] && tar -czf "$out/new.tgz" -C "$corpus" -T "$out/new.list"
exit "$rc"
