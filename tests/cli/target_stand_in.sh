#!/usr/bin/env bash
# target_stand_in.sh TALLY WORKER DIR: `--target megatron-core` end to end with the stand-in
# worker (tests/run/model_worker.sh, tally's own model behind the worker protocol), as a user
# runs it: a campaign against a "framework" that miscounts finds, shrinks and saves a failure with
# its manifests; replay judges the saved manifests without the framework, and re-executes them
# with it; `tally run` of the saved case without --target says how to replay it.
set -u
tally=$1; worker=$2; dir=$3
rm -rf "$dir"; mkdir -p "$dir"
fail() { echo "FAIL: $*"; for f in "$dir"/*.out "$dir"/*.err; do echo "--- $f"; head -c 3000 "$f"; done; exit 1; }
stand_in="$worker $tally {world}"

TALLY_TEST_WORKER_FAULT=average-rank-norms "$tally" fuzz --target megatron-core --worker "$stand_in" \
  --world 4 --cases 40 --seed 7 --max-failures 1 --shrink-time 60s --corpus "$dir/corpus" \
  >"$dir/fuzz.out" 2>"$dir/fuzz.err"
rc=$?
[ $rc = 1 ] || fail "fuzz: exit code $rc, expected 1 (a failure found)"
grep -q "^tally fuzz: seed 7, target megatron-core 0.19.2 (world 4)" "$dir/fuzz.out" || fail "fuzz: no header naming the target"
grep -q "world-4 worker up in" "$dir/fuzz.err" || fail "fuzz: the worker's start is not reported"
shrunk=$(ls "$dir"/corpus/*.shrunk.json | head -1)
[ -n "$shrunk" ] || fail "no shrunk case in the corpus"
[ -f "${shrunk%.json}.manifests/rank-0.json" ] || fail "the shrunk case's manifests were not saved next to it"
grep -q '"framework": "megatron-core"' "$shrunk" || fail "the case file does not name the framework"
grep -q "\"manifests\": \"$(basename "${shrunk%.json}").manifests\"" "$shrunk" || fail "the case file does not name its manifests"

# Without the framework: the saved manifests are judged (and the manifest folders are no cases).
"$tally" replay "$dir/corpus" >"$dir/replay.out" 2>"$dir/replay.err" || fail "replay of the saved manifests failed"
grep -q "^2 passed, 0 failed$" "$dir/replay.out" || fail "replay: expected 2 passed"
grep -q "judged from its saved manifests, megatron-core 0.19.2" "$dir/replay.out" || fail "replay does not say how it judged"

# With a framework that no longer miscounts: re-executed, and the expectation is not met.
"$tally" replay "$shrunk" --target megatron-core --worker "$stand_in" >"$dir/rerun.out" 2>"$dir/rerun.err"
rc=$?
[ $rc = 1 ] || fail "replay --target: exit code $rc, expected 1"
grep -q "MISMATCH .*expected fail, got pass; replay: tally run .* --target megatron-core$" "$dir/rerun.out" ||
  fail "replay --target: no MISMATCH line with the re-run command"

# A real target's case without --target: one line saying how to replay it.
"$tally" run "$shrunk" >"$dir/run.out" 2>"$dir/run.err"
rc=$?
[ $rc = 2 ] || fail "run without --target: exit code $rc, expected 2"
grep -q "is a megatron-core 0.19.2 case: run it with --target megatron-core" "$dir/run.err" || fail "run without --target: no hint"
echo "ok: found, shrunk, saved with manifests, replayed both ways"
