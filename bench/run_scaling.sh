#!/usr/bin/env bash
# The model target at very large worlds: one `tally run` per world and model (sim backend, the
# whole path on every rank, ledger, exact verdict), its wall time and peak memory.
# Models: "moe-pp1" (TP 8, EP 64, PP 1, 16 MoE layers, 64 experts, distributed optimizer: every
# rank holds the whole depth, and each data-parallel replica owns different pieces) and
# "moe-pp8" (the same with PP 8), and "default" (tally run's default 2-layer dense model).
# Usage: bench/run_scaling.sh [TALLY] [WORLD...]   (default build/cli/tally 65536 262144 1048576)
set -euo pipefail
tally=${1:-build/cli/tally}; shift || true
worlds=("$@")
[ $# -gt 0 ] || worlds=(65536 262144 1048576)
moe=(--tp 8 --ep 64 --etp 1 --num-layers 16 --hidden-size 64 --num-attention-heads 8 --num-experts 64
     --optimizer distributed --grads dyadic)
declare -A models=(
  [moe-pp1]="${moe[*]}"
  [moe-pp8]="${moe[*]} --pp 8"
  [default]=""
)
scratch=$(mktemp -d); trap 'rm -rf "$scratch"' EXIT
printf '%-9s %-9s %-9s %-9s %s\n' model world run_s peak_MiB verdict
for model in moe-pp1 moe-pp8 default; do
  for world in "${worlds[@]}"; do
    # shellcheck disable=SC2086
    /usr/bin/time -f '%e %M' -o "$scratch/time" "$tally" run --world "$world" ${models[$model]} >"$scratch/out" || true
    read -r seconds kib <"$scratch/time"
    verdict=$(grep -m1 '^verdict:' "$scratch/out" | cut -d' ' -f2 || true)
    printf '%-9s %-9d %-9.2f %-9d %s\n' "$model" "$world" "$seconds" $((kib / 1024)) "${verdict:-none}"
  done
done
