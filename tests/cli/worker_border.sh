#!/usr/bin/env bash
# worker_border.sh TALLY WORKER DIR: what a worker may do wrong at the border (tests/run/model_worker.sh's
# modes), through `tally run`, `fuzz` and `sweep`. Each is an infrastructure error: exit 3, one
# line naming what the worker did, the case saved with its message and whatever of its manifests
# could be copied; a sweep records it and runs its remaining cases; no process of the worker
# outlives tally, not even one that detached.
set -u
tally=$1; worker=$2; dir=$3
rm -rf "$dir"; mkdir -p "$dir"
fail() { echo "FAIL: $*"; for f in "$dir"/*.out "$dir"/*.err; do echo "--- $f"; head -c 3000 "$f"; done; exit 1; }
stand_in="$worker $tally {world}"
# gone PID: true once the process is gone (reaped, or a zombie of a parent outside tally), within 3 s.
gone() {
  for _ in $(seq 60); do
    state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)
    [ -z "$state" ] || [ "$state" = Z ] && return 0
    sleep 0.05
  done
  return 1
}

# 1. An "ok" with no folder of manifests, a FIFO as a rank's manifest, a link to /dev/zero as one.
for mode in no-manifests fifo-manifest dev-zero-manifest; do
  TALLY_TEST_WORKER_MODE=$mode "$tally" fuzz --target megatron-core --worker "$stand_in" --world 2 --cases 5 \
    --seed 3 --corpus "$dir/fuzz-$mode" >"$dir/fuzz-$mode.out" 2>"$dir/fuzz-$mode.err"
  rc=$?
  [ $rc = 3 ] || fail "fuzz $mode: exit code $rc, expected 3"
  case $mode in
    no-manifests) why="megatron-core worker \(world 2\): the worker answered \"ok\" to case-1 but left no folder of manifests: .*case-1 is missing" ;;
    fifo-manifest) why="reading the manifests in .*case-1: .*rank-0.json: is a FIFO, not a manifest" ;;
    dev-zero-manifest) why="reading the manifests in .*case-1: .*rank-0.json: is a character device, not a manifest" ;;
  esac
  grep -Eq "^infrastructure error at case 0: $why" "$dir/fuzz-$mode.out" || fail "fuzz $mode: no line naming what the worker did"
  grep -q "^summary: 1 cases in .*stopped by an infrastructure error (exit 3)$" "$dir/fuzz-$mode.out" ||
    fail "fuzz $mode: no summary"
  [ -f "$dir/fuzz-$mode/3-0.infra-error.json" ] || fail "fuzz $mode: the case is not saved"
  grep -Eq "^$why" "$dir/fuzz-$mode/3-0.infra-error.txt" || fail "fuzz $mode: the message is not saved"
  if [ $mode = no-manifests ]; then
    [ -e "$dir/fuzz-$mode/3-0.infra-error.manifests" ] && fail "fuzz $mode: a folder of manifests saved that the worker never left"
  else
    [ -f "$dir/fuzz-$mode/3-0.infra-error.manifests/rank-1.json" ] || fail "fuzz $mode: rank 1's manifest is not saved"
    grep -q "rank-0.json: a " "$dir/fuzz-$mode/3-0.infra-error.manifests/NOT-COPIED.txt" ||
      fail "fuzz $mode: what was not copied is not listed"
  fi
done

# A link to the right manifest, kept elsewhere: read, it would pass, but its saved copy could not be
# judged again (a copy follows no link), so it is the worker's error too.
TALLY_TEST_WORKER_MODE=link-manifest "$tally" fuzz --target megatron-core --worker "$stand_in" --world 2 --cases 5 \
  --seed 3 --corpus "$dir/fuzz-link" >"$dir/fuzz-link.out" 2>"$dir/fuzz-link.err"
rc=$?
[ $rc = 3 ] || fail "fuzz link-manifest: exit code $rc, expected 3"
grep -Eq "^infrastructure error at case 0: the manifests of case-1: .*rank-0.json is a symbolic link: " "$dir/fuzz-link.out" ||
  fail "fuzz link-manifest: no line naming the link"

# run --save: the worker's error, not the user's (exit 3, not 2), saved with what could be copied.
mkdir -p "$dir/run"
TALLY_TEST_WORKER_MODE=dev-zero-manifest "$tally" run --world 2 --tp 2 --target megatron-core --worker "$stand_in" \
  --save "$dir/run/case.json" >"$dir/run.out" 2>"$dir/run.err"
rc=$?
[ $rc = 3 ] || fail "run --save dev-zero-manifest: exit code $rc, expected 3"
grep -q "rank-0.json: is a character device" "$dir/run.out" "$dir/run.err" || fail "run --save: no line naming what the worker did"
[ -f "$dir/run/case.manifests/NOT-COPIED.txt" ] || fail "run --save: what was not copied is not listed"
grep -q "rank-0.json: is a character device" "$dir/run/case.infra-error.txt" || fail "run --save: the message is not saved"
for mode in no-manifests fifo-manifest; do
  TALLY_TEST_WORKER_MODE=$mode "$tally" run --world 2 --tp 2 --target megatron-core --worker "$stand_in" \
    --save "$dir/run/$mode.json" >"$dir/run-$mode.out" 2>"$dir/run-$mode.err"
  rc=$?
  [ $rc = 3 ] || fail "run --save $mode: exit code $rc, expected 3"
  [ -f "$dir/run/$mode.json" ] && [ -s "$dir/run/$mode.infra-error.txt" ] || fail "run --save $mode: the case or its message is not saved"
done
# run --manifests DIR: the same, the copy in DIR listing what it left out.
TALLY_TEST_WORKER_MODE=fifo-manifest "$tally" run --world 2 --tp 2 --target megatron-core --worker "$stand_in" \
  --manifests "$dir/run-manifests" >"$dir/run-manifests.out" 2>"$dir/run-manifests.err"
rc=$?
[ $rc = 3 ] || fail "run --manifests fifo-manifest: exit code $rc, expected 3: $(cat "$dir/run-manifests.err")"
grep -q "rank-0.json: a FIFO, not copied" "$dir/run-manifests/NOT-COPIED.txt" ||
  fail "run --manifests: what was not copied is not listed"
[ -f "$dir/run-manifests/rank-1.json" ] || fail "run --manifests: rank 1's manifest is not copied"

# A sweep goes on past the error; resumed, it runs that case again.
sweep=(sweep --world 2 --features moe --shard 0/5 --target megatron-core --worker "$stand_in" --no-known)
TALLY_TEST_WORKER_MODE=no-manifests "$tally" "${sweep[@]}" --corpus "$dir/sweep" >"$dir/sweep.out" 2>"$dir/sweep.err"
rc=$?
[ $rc = 3 ] || fail "sweep no-manifests: exit code $rc, expected 3"
grep -Eq "^INFRA L[0-9]+-moe-[a-z-]+: megatron-core worker \(world 2\): the worker answered \"ok\" to case-1" "$dir/sweep.out" ||
  fail "sweep: no INFRA line naming what the worker did"
grep -Eq "^  passed [1-9][0-9]*, failed 0 \(new 0, known 0\), refused [0-9]+, infrastructure errors 1$" "$dir/sweep.out" ||
  fail "sweep: it did not run its remaining cases"
grep -q "stopped before the end" "$dir/sweep.out" && fail "sweep: one error stopped it"
ls "$dir/sweep"/L*.infra-error.txt >/dev/null 2>&1 || fail "sweep: the message is not saved next to the case"
# Resumed on a mended worker, the case that gave no verdict runs again, and only it.
"$tally" "${sweep[@]}" --corpus "$dir/sweep" >"$dir/sweep-resumed.out" 2>"$dir/sweep-resumed.err"
rc=$?
[ $rc = 0 ] || fail "resumed sweep: exit code $rc, expected 0 (the case without a verdict ran again and passed)"
grep -q ", 1 to run (" "$dir/sweep-resumed.out" || fail "resumed sweep: it did not run exactly the case without a verdict again"
grep -q "^state: 1 of its cases gave an infrastructure error, no verdict: they run again$" "$dir/sweep-resumed.out" ||
  fail "resumed sweep: it does not say why the case runs again"

# 2. A queue loop one case behind: another case's manifests, never a verdict on the framework.
TALLY_TEST_WORKER_MODE=stale "$tally" "${sweep[@]}" --corpus "$dir/stale" >"$dir/stale.out" 2>"$dir/stale.err"
rc=$?
[ $rc = 3 ] || fail "sweep stale: exit code $rc, expected 3"
grep -q "^NEW" "$dir/stale.out" && fail "sweep stale: another case's manifests judged as the framework's"
grep -Eq "^INFRA .*: the manifests in .*case-2: rank 0's manifest is of another case: it echoes case_digest [0-9a-f]{16} \(case-1's\), not case-2's [0-9a-f]{16}: the worker answered case-2 with the manifests of case-1$" "$dir/stale.out" ||
  fail "sweep stale: no line naming both cases"
grep -q "^three infrastructure errors in a row: the sweep stops" "$dir/stale.out" || fail "sweep stale: it did not stop"
# Replayed without the framework, the saved cases are still no verdict on it (their manifests echo
# the digest of the case before): the infrastructure errors they expect, and without an expectation
# (one expecting a pass) an infrastructure error naming why.
"$tally" replay "$dir/stale" >"$dir/stale-replay.out" 2>"$dir/stale-replay.err"
rc=$?
[ $rc = 0 ] || fail "replay of the stale sweep's cases: exit code $rc, expected 0: $(tail -5 "$dir/stale-replay.out")"
[ "$(grep -c "(infra-error as expected, judged from its saved manifests" "$dir/stale-replay.out")" = 3 ] ||
  fail "replay stale: not the infrastructure errors the cases expect: $(cat "$dir/stale-replay.out")"
first=$(ls "$dir/stale"/L*.json | head -1)
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c.pop("expect"); json.dump(c, open(sys.argv[2], "w"))' \
  "$first" "$dir/stale/unexpected.json"
"$tally" replay "$dir/stale/unexpected.json" >"$dir/stale-unexpected.out" 2>"$dir/stale-unexpected.err"
rc=$?
[ $rc = 1 ] || fail "replay of a stale case without its expectation: exit code $rc, expected 1 (not the pass it expects)"
grep -q "expected pass, got infra-error (the manifests in .*: rank 0's manifest echoes case_digest [0-9a-f]*, not this case's [0-9a-f]*: they answer another case" \
  "$dir/stale-unexpected.out" || fail "replay stale: the other case's manifests not named"
rm -f "$dir/stale/unexpected.json"

# A worker that fails every other case stops the sweep too.
TALLY_TEST_WORKER_MODE=error-every-other "$tally" sweep --world 2 --features moe --target megatron-core \
  --worker "$stand_in" --no-known --corpus "$dir/every-other" \
  >"$dir/every-other.out" 2>"$dir/every-other.err"
rc=$?
[ $rc = 3 ] || fail "sweep error-every-other: exit code $rc, expected 3"
grep -q "^5 infrastructure errors in the last 10 cases: the sweep stops" "$dir/every-other.out" ||
  fail "sweep error-every-other: it did not stop"

# 3. A child detached just before the worker dies, and a double-forked daemon: gone with tally.
TALLY_TEST_WORKER_MODE=detach-and-die "$tally" run --world 2 --tp 2 --target megatron-core --worker "$stand_in" \
  --worker-dir "$dir/late" --start-timeout 20s >"$dir/late.out" 2>"$dir/late.err"
rc=$?
[ $rc = 3 ] || fail "detach-and-die: exit code $rc, expected 3"
late=$(cat "$dir/late/world-2/late.pid")
gone "$late" || fail "the child detached before the worker died ($late) outlived tally"
TALLY_TEST_WORKER_MODE=daemon "$tally" fuzz --target megatron-core --worker "$stand_in" --world 2 --cases 3 --seed 3 \
  --worker-dir "$dir/daemon" --corpus "$dir/daemon-corpus" >"$dir/daemon.out" 2>"$dir/daemon.err"
rc=$?
[ $rc = 0 ] || fail "daemon: exit code $rc, expected 0"
[ "$(wc -l <"$dir/daemon/daemon.pids")" = 3 ] || fail "daemon: the stand-in left no daemon per case"
while read -r daemon; do gone "$daemon" || fail "a double-forked daemon of the worker ($daemon) outlived tally"; done \
  <"$dir/daemon/daemon.pids"

# 5. The framework's own check declines a case at set-up: a refusal counted by its reason, never an
# error that ends a campaign or a sweep; where it declines most of them, nothing was checked.
TALLY_TEST_WORKER_MODE=refuse-odd "$tally" fuzz --target megatron-core --worker "$stand_in" --world 2 --cases 8 \
  --seed 3 --corpus "$dir/refused" >"$dir/refused.out" 2>"$dir/refused.err"
rc=$?
[ $rc = 0 ] || fail "fuzz refuse-odd: exit code $rc, expected 0 (refusals are no failures)"
grep -q "^summary: 8 cases in .*, 0 failures, refused 4, seed 3$" "$dir/refused.out" || fail "fuzz refuse-odd: it did not run its 8 cases"
grep -q "^  refused 4x by megatron-core 0.19.2: ValueError: the framework declines odd cases (as asked)$" "$dir/refused.out" ||
  fail "fuzz refuse-odd: the refusals are not counted by their reason"
TALLY_TEST_WORKER_MODE=refuse-odd "$tally" "${sweep[@]}" --corpus "$dir/refused-sweep" >"$dir/refused-sweep.out" \
  2>"$dir/refused-sweep.err"
rc=$?
# Of the 9 cases this shard sends the worker, it refuses 5: most, so nothing was checked (exit 3).
[ $rc = 3 ] || fail "sweep refuse-odd: exit code $rc, expected 3 (the framework refused most of what it was sent)"
grep -q "^  nothing was checked: the framework refused 5 of the 9 cases tally sent it (exit 3)" "$dir/refused-sweep.out" ||
  fail "sweep refuse-odd: it does not say that nothing was checked"
grep -Eq "^  refused by the framework [0-9]+x: megatron-core 0.19.2 refused it as it set it up: rank 0: ValueError: the framework declines odd cases \(as asked\)$" \
  "$dir/refused-sweep.out" || fail "sweep refuse-odd: the refusals are not counted by their reason"
grep -Eq "^  refused by tally's rules [0-9]+, by the framework itself [1-9][0-9]*$" "$dir/refused-sweep.out" ||
  fail "sweep refuse-odd: the framework's refusals are not counted apart from the rules'"
TALLY_TEST_WORKER_MODE=refuse-odd "$tally" run --world 2 --tp 2 --target megatron-core --worker "$stand_in" \
  >"$dir/refused-run.out" 2>"$dir/refused-run.err"
rc=$?
[ $rc = 2 ] || fail "run refuse-odd: exit code $rc, expected 2 (a refusal)"
grep -q "megatron-core 0.19.2 refused this case as it set it up: rank 0: ValueError: the framework declines odd cases" \
  "$dir/refused-run.err" || fail "run refuse-odd: the refusal is not named"

# 4. A hello whose version is not a release, and a corrupt sweep state.
TALLY_TEST_WORKER_MODE=hello-version-not-a-version "$tally" run --world 2 --tp 2 --target megatron-core \
  --worker "$stand_in" >"$dir/version.out" 2>"$dir/version.err"
rc=$?
[ $rc = 3 ] || fail "a hello with a bad version: exit code $rc, expected 3"
grep -q "hello.version: expected a release such as \"0.19.2\"" "$dir/version.err" || fail "a bad version is not named"
mkdir -p "$dir/corrupt" && printf '{"tally_sweep": 1,' >"$dir/corrupt/sweep-state.json"
"$tally" sweep --world 2 --features moe --corpus "$dir/corrupt" >"$dir/corrupt.out" 2>"$dir/corrupt.err"
rc=$?
[ $rc = 2 ] || fail "a corrupt state: exit code $rc, expected 2"
[ "$(grep -o "sweep-state.json" "$dir/corrupt.err" | wc -l)" = 1 ] || fail "a corrupt state's message names its path other than once"
echo "ok: every misbehaviour of the border is an infrastructure error that names it, saved; sweeps go on; nothing outlives tally"
