#!/usr/bin/env bash
# Real DeepSpeed cases per minute: `tally fuzz --target deepspeed` (one persistent worker per
# world, its ranks kept up across cases) side by side with one torchrun per case (`tally run
# CASE --target deepspeed` in a fresh process: a worker started for one case), at each world.
#
#   bench/deepspeed_target_rate.sh TALLY SECONDS OUT WORLD...
#
# Needs torch and deepspeed importable (PYTHONPATH or installed) and the adapters on PYTHONPATH
# (added here). DS_ACCELERATOR=cpu runs on the CPU accelerator. Prints one row per world; OUT
# keeps each campaign's corpus, the workers' logs and the per-case runs' output.
set -u
tally=${1:?usage: deepspeed_target_rate.sh TALLY SECONDS OUT WORLD...}
seconds=${2:?seconds per campaign}
out=${3:?output folder}
shift 3
here=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$here/adapters${PYTHONPATH:+:$PYTHONPATH}"  # tally_adapters from the checkout
version=$(python3 -c 'import deepspeed; print(deepspeed.__version__)' 2>/dev/null | tail -1)
mkdir -p "$out"
rows=()
for world in "$@"; do
  # The baseline case: the first DeepSpeed case file of seeds/real at this world, else any.
  case_file=$(grep -l "\"world\": $world," "$here"/seeds/real/deepspeed-*.json 2>/dev/null | head -1)
  [ -n "$case_file" ] || case_file=$(ls "$here"/seeds/real/deepspeed-*.json | head -1)
  start=$(date +%s.%N)
  "$tally" replay "$case_file" --target deepspeed --worker-dir "$out/one-w$world" >"$out/one-w$world.log" 2>&1
  one_rc=$?
  one_s=$(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')")
  "$tally" fuzz --target deepspeed --world "$world" --time "${seconds}s" --seed "$world" \
    --corpus "$out/corpus-w$world" --worker-dir "$out/worker-w$world" --max-failures 5 \
    --shrink-time 30s --case-timeout 120s --json >"$out/fuzz-w$world.json" 2>"$out/fuzz-w$world.err"
  fuzz_rc=$?
  rows+=("$(python3 - "$out/fuzz-w$world.json" "$world" "$one_s" "$one_rc" "$fuzz_rc" <<'PY'
import json, sys
path, world, one_s, one_rc, fuzz_rc = sys.argv[1:]
try:
    j = json.load(open(path))
except Exception:
    print(f"{world:>5}  fuzz gave no summary (exit {fuzz_rc}); see {path[:-5]}.err")
    sys.exit()
# Every case the worker executed: the generated ones and the shrinker's.
executed = j["cases"] + sum(f["shrink_runs"] for f in j["failures"])
per_min = 60 * executed / j["seconds"] if j["seconds"] else 0
base = 60 / float(one_s)
print(f"{world:>5}  {j['cases']:>4} generated + {executed - j['cases']:>4} shrink runs in {j['seconds']:6.1f} s  "
      f"{per_min:7.1f}/min  one worker per case {one_s:>5} s (rc {one_rc}) {base:5.2f}/min  "
      f"ratio {per_min / base:6.1f}x  failures {len(j['failures'])}")
PY
)")
done
echo "deepspeed $version, accelerator ${DS_ACCELERATOR:-auto}, ${seconds} s per campaign (failures shrunk inside it)"
echo "world  cases executed (generated + shrink runs)     rate     one worker per case                 speed-up"
printf '%s\n' "${rows[@]}"
