#!/usr/bin/env bash
# Real cases per minute: `tally fuzz --target megatron-core` (one persistent worker per world, its
# ranks kept up across cases) side by side with one torchrun per case
# (adapters/examples/megatron/tiny_moe_gpt.py, the way real runs were checked before), at each world.
#
#   bench/real_target_rate.sh TALLY SECONDS OUT WORLD...
#
# Needs torch and megatron-core importable (PYTHONPATH) and a GPU. Worlds above the GPU count run
# on gloo (several ranks per GPU). Prints one row per world; OUT keeps each campaign's corpus
# (failures with their manifests), the workers' logs and the torchrun case's log.
set -u
tally=${1:?usage: real_target_rate.sh TALLY SECONDS OUT WORLD...}
seconds=${2:?seconds per campaign}
out=${3:?output folder}
shift 3
here=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$here/adapters${PYTHONPATH:+:$PYTHONPATH}"  # tally_adapters from the checkout
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
version=$(python3 -c 'from megatron.core import package_info; print(package_info.__version__)')
mkdir -p "$out"
rows=()
for world in "$@"; do
  backend=nccl
  [ "$world" -gt "$gpus" ] && backend=gloo
  start=$(date +%s.%N)
  python3 -m torch.distributed.run --standalone --nproc-per-node "$world" \
    "$here/adapters/examples/megatron/tiny_moe_gpt.py" --backend "$backend" --tp 2 --ep 2 --etp 1 \
    --optimizer adam --gradients hashed --out "$out/torchrun-w$world" >"$out/torchrun-w$world.log" 2>&1
  torchrun_rc=$?
  torchrun_s=$(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')")
  "$tally" fuzz --target megatron-core --world "$world" --time "${seconds}s" --seed "$world" \
    --corpus "$out/corpus-w$world" --worker-dir "$out/worker-w$world" --max-failures 5 \
    --shrink-time 60s --case-timeout 120s --json >"$out/fuzz-w$world.json" 2>"$out/fuzz-w$world.err"
  fuzz_rc=$?
  rows+=("$(python3 - "$out/fuzz-w$world.json" "$world" "$torchrun_s" "$torchrun_rc" "$fuzz_rc" <<'PY'
import json, sys
path, world, torchrun_s, torchrun_rc, fuzz_rc = sys.argv[1:]
try:
    j = json.load(open(path))
except Exception:
    print(f"{world:>5}  fuzz gave no summary (exit {fuzz_rc}); see {path[:-5]}.err")
    sys.exit()
per_min = 60 * j["cases"] / j["seconds"] if j["seconds"] else 0
base = 60 / float(torchrun_s)
print(f"{world:>5}  {j['cases']:>6} cases in {j['seconds']:6.1f} s  {per_min:7.1f}/min  "
      f"torchrun per case {torchrun_s:>5} s (rc {torchrun_rc}) {base:5.2f}/min  "
      f"ratio {per_min / base:6.1f}x  failures {len(j['failures'])}")
PY
)")
done
echo "megatron-core $version, $gpus GPU(s), ${seconds} s per campaign (failures shrunk inside it)"
echo "world  generated cases              rate          one torchrun per case                  speed-up"
printf '%s\n' "${rows[@]}"
