#!/usr/bin/env bash
# How large a run `tally check` judges, and how fast: tally's own model writes the manifests of
# one MoE case per world (distributed optimizer, dyadic gradients) in each format version, then
# check reads and judges them. Prints, per world and version: manifest MiB, write seconds, check
# seconds and peak MiB, ranks/s. Version 1 grows with the world squared: it is written only up to
# V1_MAX_WORLD (default 4096).
# Usage: bench/check_scaling.sh [TALLY] [WORLD...]   (default build/cli/tally 64 512 2048 4096)
set -euo pipefail
tally=${1:-build/cli/tally}; shift || true
worlds=("$@")
[ $# -gt 0 ] || worlds=(64 512 2048 4096)
v1_max_world=${V1_MAX_WORLD:-4096}
case_flags=(--tp 2 --ep 4 --etp 1 --num-layers 2 --hidden-size 16 --num-attention-heads 4
            --num-experts 8 --moe-ffn-hidden-size 32 --ffn-hidden-size 32 --vocab-size 64
            --optimizer distributed --grads dyadic)
scratch=$(mktemp -d); trap 'rm -rf "$scratch"' EXIT
printf '%-8s %-8s %-13s %-9s %-9s %-15s %s\n' world version manifest_MiB write_s check_s check_peak_MiB ranks/s
for world in "${worlds[@]}"; do
  for version in 2 1; do
    [ "$version" = 2 ] || [ "$world" -le "$v1_max_world" ] || continue
    dir=$scratch/w$world-v$version
    start=$(date +%s.%N)
    "$tally" run --world "$world" "${case_flags[@]}" --manifests "$dir" --manifest-version "$version" >/dev/null
    written=$(date +%s.%N)
    /usr/bin/time -f '%M' -o "$scratch/peak" "$tally" check "$dir" >"$scratch/out"
    checked=$(date +%s.%N)
    grep -q '^verdict: PASS$' "$scratch/out" || { echo "world $world v$version: check did not pass"; cat "$scratch/out"; exit 1; }
    mib=$(du -sm "$dir" | cut -f1)
    awk -v w="$world" -v v="$version" -v m="$mib" -v a="$start" -v b="$written" -v c="$checked" -v p="$(cat "$scratch/peak")" \
      'BEGIN { printf "%-8d %-8d %-13d %-9.2f %-9.2f %-15d %.0f\n", w, v, m, b - a, c - b, p / 1024, w / (c - b) }'
    rm -rf "$dir"
  done
done
