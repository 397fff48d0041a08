#!/usr/bin/env bash
# How large a run `tally check` judges, and how fast: tally's own model writes the manifests of
# one MoE case per world (distributed optimizer, dyadic gradients), then check reads and judges
# them. Prints, per world: manifest MiB, write seconds, check seconds and peak MiB, ranks/s.
# Usage: bench/check_scaling.sh [TALLY] [WORLD...]   (default build/cli/tally 64 512 2048)
set -euo pipefail
tally=${1:-build/cli/tally}; shift || true
worlds=("${@:-64}")
[ $# -gt 0 ] || worlds=(64 512 2048)
case_flags=(--tp 2 --ep 4 --etp 1 --num-layers 2 --hidden-size 16 --num-attention-heads 4
            --num-experts 8 --moe-ffn-hidden-size 32 --ffn-hidden-size 32 --vocab-size 64
            --optimizer distributed --grads dyadic)
scratch=$(mktemp -d); trap 'rm -rf "$scratch"' EXIT
printf '%-7s %-14s %-9s %-9s %-13s %s\n' world manifest_MiB write_s check_s check_peak_MiB ranks/s
for world in "${worlds[@]}"; do
  dir=$scratch/w$world
  start=$(date +%s.%N)
  "$tally" run --world "$world" "${case_flags[@]}" --manifests "$dir" >/dev/null
  written=$(date +%s.%N)
  /usr/bin/time -f '%M' -o "$scratch/peak" "$tally" check "$dir" >"$scratch/out"
  checked=$(date +%s.%N)
  grep -q '^verdict: PASS$' "$scratch/out" || { echo "world $world: check did not pass"; cat "$scratch/out"; exit 1; }
  mib=$(du -sm "$dir" | cut -f1)
  awk -v w="$world" -v m="$mib" -v a="$start" -v b="$written" -v c="$checked" -v p="$(cat "$scratch/peak")" \
    'BEGIN { printf "%-7d %-14d %-9.2f %-9.2f %-13d %.0f\n", w, m, b - a, c - b, p / 1024, w / (c - b) }'
  rm -rf "$dir"
done
