#!/usr/bin/env bash
# Known findings end to end, on the stand-in worker with a planted miscount (the "framework"
# drops TP duplicates' filter): a campaign finds and saves failures (exit 1); the same campaign
# with --known pointing at them counts every failure as known (exit 0: a saved run no finding file
# claims is known in its own layout), shrinks none; a sweep over other layouts calls them new until
# a finding file states the corner where the cause acts, and then counts them known.
#   target_known.sh TALLY STAND_IN_WORKER DIR
set -u
tally=$1; worker="$2 $1 {world}"; dir=$3
rm -rf "$dir"; mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
export TALLY_TEST_WORKER_FAULT=no-dedup-filter
"$tally" fuzz --target megatron-core --worker "$worker" --world 2 --cases 40 --seed 3 --corpus "$dir/found" \
  --no-known >"$dir/found.out" 2>&1
[ $? = 1 ] || fail "the first campaign found nothing: $(tail -3 "$dir/found.out")"
"$tally" fuzz --target megatron-core --worker "$worker" --world 2 --cases 40 --seed 3 --corpus "$dir/again" \
  --known "$dir/found" >"$dir/again.out" 2>&1
rc=$?
grep -Eq "^summary: 40 cases .*, ([0-9]+) failures \(new 0, known \1\)" "$dir/again.out" || fail "not every failure was known: $(grep summary "$dir/again.out")"
[ $rc = 0 ] || fail "known findings alone exited $rc"
grep -q "shrinking" "$dir/again.out" && fail "a known failure was shrunk"
"$tally" sweep --world 2 --features dense --target megatron-core --worker "$worker" --corpus "$dir/sweep" \
  --known "$dir/found" >"$dir/sweep.out" 2>&1
[ $? = 1 ] || fail "the sweep knew layouts no saved run or finding file covers: $(grep -A1 summary "$dir/sweep.out")"
cat >"$dir/found/no-dedup-filter.finding.json" <<'JSON'
{
  "tally_finding": 1,
  "framework": "megatron-core",
  "version": "0.19.2",
  "source": "tests/cli/target_known.sh: the stand-in planting no-dedup-filter",
  "corner": {"norm_codes": ["plain", "distributed", "layerwise", "muon"], "needs": ["tp > 1"]},
  "miscounts": [{"kind": "replicated over TP", "counted": "more", "in": "any"},
                {"kind": "tensor-parallel shard", "counted": "more", "in": "any"}],
  "saved_runs": []
}
JSON
"$tally" sweep --world 2 --features dense --target megatron-core --worker "$worker" --corpus "$dir/sweep" \
  --known "$dir/found" --fresh >"$dir/sweep.out" 2>&1
rc=$?
grep -Eq "^  passed [0-9]+, failed ([0-9]+) \(new 0, known \1\)" "$dir/sweep.out" || fail "the sweep counted new failures: $(grep -A1 summary "$dir/sweep.out")"
grep -q "known no-dedup-filter: " "$dir/sweep.out" || fail "the finding file is not named: $(grep known "$dir/sweep.out")"
[ $rc = 0 ] || fail "the sweep of known findings exited $rc"
echo "ok: known findings counted apart in a campaign and a sweep"
