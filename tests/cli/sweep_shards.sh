#!/usr/bin/env bash
# tally sweep end to end on tally's model: a world-2 sweep in two shards, each resumed after a
# finished run (nothing to run again), merged into the whole sweep's report, which matches the
# unsharded sweep's; a state whose numbers name other cases runs those again; a state of another
# sweep is refused naming it.
#   sweep_shards.sh TALLY DIR
set -u
tally=$1; dir=$2
rm -rf "$dir"; mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
"$tally" sweep --world 2 --corpus "$dir/whole" --json >"$dir/whole.json" || fail "the whole sweep failed"
for shard in 0 1; do
  "$tally" sweep --world 2 --shard $shard/2 --corpus "$dir/shards" >"$dir/shard$shard.out" || fail "shard $shard failed"
  "$tally" sweep --world 2 --shard $shard/2 --corpus "$dir/shards" >"$dir/again$shard.out" || fail "shard $shard again failed"
  grep -q ", 0 to run (" "$dir/again$shard.out" || fail "shard $shard was not resumed from its state: $(head -1 "$dir/again$shard.out")"
done
"$tally" sweep --merge "$dir/shards/sweep-state-shard-0-of-2.json" "$dir/shards/sweep-state-shard-1-of-2.json" \
  --json --junit "$dir/merged.xml" >"$dir/merged.json" || fail "the merge failed"
python3 - "$dir/whole.json" "$dir/merged.json" <<'PY' || fail "the merged shards differ from the whole sweep"
import json, sys
whole, merged = (json.load(open(f)) for f in sys.argv[1:])
strip = lambda report: [(r["index"], r["id"], r["outcome"]) for r in report["results"]]
assert strip(whole) == strip(merged), "results differ"
assert merged["layouts"] == whole["layouts"] == 10 and merged["configurations"] == 1200
PY
grep -q "<testsuite" "$dir/merged.xml" || fail "no JUnit report"
# A state whose numbers name other cases (an earlier tally's order): those run again, said so.
python3 - "$dir/whole/sweep-state.json" <<'PY' || fail "could not renumber the state"
import json, sys
state = json.load(open(sys.argv[1]))
a, b = state["results"][0], state["results"][1]
a["id"], b["id"] = b["id"], a["id"]
json.dump(state, open(sys.argv[1], "w"))
PY
"$tally" sweep --world 2 --corpus "$dir/whole" >"$dir/renumbered.out" || fail "the renumbered state's sweep failed"
grep -q "^state: 2 of its results number their cases otherwise" "$dir/renumbered.out" &&
  grep -q ", 2 to run (" "$dir/renumbered.out" || fail "a renumbered state's results stood for other cases: $(head -3 "$dir/renumbered.out")"
"$tally" sweep --world 4 --corpus "$dir/whole" >"$dir/other.out" 2>"$dir/other.err"
[ $? = 2 ] && grep -q "is of another sweep" "$dir/other.err" || fail "a state of another sweep was not refused: $(cat "$dir/other.err")"
echo "ok: two shards resumed and merged into the whole sweep"
