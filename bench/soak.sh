#!/usr/bin/env bash
# A fault-free soak of tally's own model: many campaigns side by side, one per core, over every
# gradient mode, dtype, accumulation, optimizer model and max_norm the generator draws (fuzz/
# generators.cpp: pick_path_options) and over worlds up to each campaign's --max-world. Every FAIL
# of a fault-free case is a false verdict of the judge: the soak exists to find them.
#
#   bench/soak.sh TALLY SECONDS OUT [JOBS] [FIRST_SEED]
#
# Runs JOBS campaigns at a time (default: the cores), each `tally fuzz --seed S --max-world W
# --time SECONDS`, cycling W through TALLY_SOAK_WORLDS (default "8 64 512 4096") and S upward from
# FIRST_SEED (default 1), until JOBS campaigns of each entry have run (TALLY_SOAK_CAMPAIGNS: that
# many campaigns in all instead, e.g. one round of JOBS over a mix of worlds). Each writes OUT/soak-S-W.json (its summary) and, for a
# failure, OUT/corpus-S-W/ (the case and its shrunk copy). Then one line per max-world and a total:
# campaigns, cases, cases per second, failures. Exit 0 when no case failed, 1 otherwise.
set -euo pipefail
tally=${1:?usage: soak.sh TALLY SECONDS OUT [JOBS] [FIRST_SEED]}
seconds=${2:?usage: soak.sh TALLY SECONDS OUT [JOBS] [FIRST_SEED]}
out=${3:?usage: soak.sh TALLY SECONDS OUT [JOBS] [FIRST_SEED]}
jobs=${4:-$(nproc)}
first_seed=${5:-1}
[ -x "$tally" ] || { echo "soak.sh: $tally is not an executable file" >&2; exit 2; }
mkdir -p "$out"
read -r -a worlds <<<"${TALLY_SOAK_WORLDS:-8 64 512 4096}"
campaigns=${TALLY_SOAK_CAMPAIGNS:-$((${#worlds[@]} * jobs))}
echo "soak: $campaigns campaigns of ${seconds}s, $jobs at a time, seeds $first_seed.., max worlds ${worlds[*]}"
for ((i = 0; i < campaigns; ++i)); do
  seed=$((first_seed + i))
  world=${worlds[$((i % ${#worlds[@]}))]}
  # --max-failures 0: a false FAIL does not end the campaign; each is shrunk (30 s at most).
  # --jobs 1: the campaigns share the cores, one each.
  "$tally" fuzz --seed "$seed" --max-world "$world" --time "${seconds}s" --max-failures 0 --jobs 1 \
    --shrink-time 30s --corpus "$out/corpus-$seed-$world" --json >"$out/soak-$seed-$world.json" \
    2>"$out/soak-$seed-$world.err" || true &
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
done
wait
python3 - "$out" <<'PY'
import collections, glob, json, os, sys
out = sys.argv[1]
by_world = collections.defaultdict(lambda: [0, 0, 0.0, 0])
broken = []
for path in sorted(glob.glob(os.path.join(out, "soak-*.json"))):
    world = int(path.rsplit("-", 1)[1].split(".")[0])
    try:
        summary = json.load(open(path))
    except ValueError:
        broken.append(path)
        continue
    row = by_world[world]
    row[0] += 1
    row[1] += summary["cases"]
    row[2] += summary["seconds"]
    row[3] += len(summary["failures"])
    for failure in summary["failures"]:
        print(f"FAIL {path}: case {failure.get('case')}: {failure.get('failure')}: "
              f"{failure.get('shrunk') or failure.get('original')}")
total = [0, 0, 0.0, 0]
print("max_world  campaigns  cases  cases/s (per campaign)  failures")
for world in sorted(by_world):
    c, n, s, f = by_world[world]
    print(f"{world:>9}  {c:>9}  {n:>11,}  {n / s if s else 0:>10.0f}  {f:>8}")
    total = [a + b for a, b in zip(total, by_world[world])]
print(f"{'all':>9}  {total[0]:>9}  {total[1]:>11,}  {total[1] / total[2] if total[2] else 0:>10.0f}  {total[3]:>8}")
for path in broken:
    print(f"no summary: {path} (see {path[:-5]}.err)")
sys.exit(1 if total[3] or broken else 0)
PY
