#!/usr/bin/env bash
# tally sweep --jobs: lanes side by side give the report one lane gives, on tally's model and on a
# real target through the stand-in worker (a worker of the world per lane, each in its own folder
# under --worker-dir, each running cases); a state written by lanes resumes with one; --jobs on a
# backend that runs one case at a time is refused naming it.
#   sweep_lanes.sh TALLY STAND_IN DIR
set -u
tally=$1; stand_in=$2; dir=$3
rm -rf "$dir"; mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
same() {  # same REPORT REPORT: the same cases with the same outcomes, details and known findings
  python3 - "$1" "$2" <<'PY' || fail "lanes changed the report: $1 against $2"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
strip = lambda report: [(r["index"], r["id"], r["outcome"], r.get("detail"), r.get("known")) for r in report["results"]]
assert strip(a) == strip(b) and len(a["results"]) == a["total_cases"], (len(a["results"]), len(b["results"]))
PY
}
"$tally" sweep --world 4 --corpus "$dir/model-1" --json >"$dir/model-1.json" || fail "one lane on tally's model"
"$tally" sweep --world 4 --corpus "$dir/model-3" --jobs 3 --json >"$dir/model-3.json" || fail "three lanes on tally's model"
same "$dir/model-1.json" "$dir/model-3.json"

worker="$stand_in $tally {world}"
"$tally" sweep --world 2 --features moe --target megatron-core --worker "$worker" --no-known \
  --corpus "$dir/real-1" --json >"$dir/real-1.json" 2>"$dir/real-1.err" || fail "one lane on the stand-in: $(tail -3 "$dir/real-1.err")"
"$tally" sweep --world 2 --features moe --target megatron-core --worker "$worker" --no-known --jobs 3 \
  --worker-dir "$dir/workers" --corpus "$dir/real-3" >"$dir/real-3.out" 2>"$dir/real-3.err" ||
  fail "three lanes on the stand-in: $(tail -3 "$dir/real-3.out" "$dir/real-3.err")"
grep -q "^lanes: 3 side by side, each taking whole layouts (a worker of world 2 each)$" "$dir/real-3.out" ||
  fail "no lanes line: $(head -5 "$dir/real-3.out")"
same "$dir/real-1.json" "$dir/real-3/sweep-state.json"
total=0
for log in "$dir/workers/world-2/worker.log" "$dir/workers/lane-1/world-2/worker.log" "$dir/workers/lane-2/world-2/worker.log"; do
  [ -f "$log" ] || fail "no worker of its own for a lane: $log missing"
  n=$(grep -c "^model_worker.sh: case " "$log")
  [ "$n" -gt 0 ] || fail "a lane ran no case: $log"
  total=$((total + n))
done
ran=$(python3 -c 'import json,sys; print(sum(r["outcome"] != "refused" for r in json.load(open(sys.argv[1]))["results"]))' "$dir/real-1.json")
[ "$total" = "$ran" ] || fail "the lanes' workers ran $total cases where the sweep runs $ran (the others refused)"
"$tally" sweep --world 2 --features moe --target megatron-core --worker "$worker" --no-known \
  --corpus "$dir/real-3" >"$dir/again.out" 2>&1 || fail "resuming the lanes' state with one lane"
grep -q ", 0 to run (" "$dir/again.out" || fail "the lanes' state did not resume: $(head -1 "$dir/again.out")"
# One lane whose worker fails every case stops the sweep, however the other lanes fare, and says which.
TALLY_TEST_WORKER_MODE=error-on-lane-1 "$tally" sweep --world 2 --features moe --target megatron-core --worker "$worker" \
  --no-known --jobs 3 --worker-dir "$dir/failing-lane" --corpus "$dir/failing-lane-corpus" >"$dir/failing-lane.out" 2>&1
rc=$?
[ $rc = 3 ] || fail "a failing lane: exit code $rc, expected 3"
[ "$(grep -c "infrastructure errors in a row (lane 1): the sweep stops" "$dir/failing-lane.out")" = 1 ] ||
  fail "a failing lane: not one line naming it: $(grep -i stops "$dir/failing-lane.out")"
echo "ok: three lanes give one lane's report, on tally's model and on three stand-in workers; a failing lane stops them"
