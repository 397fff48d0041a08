#!/usr/bin/env bash
# ci/nightly-real end to end with the stand-in worker posing as megatron-core 0.19.2 and
# miscounting (no-dedup-filter): the world-2 sweep and a short campaign each find new failures,
# the exit code says so, and the night's index links the sweep's report, lists each new failure
# with its evidence and each case where tally's model of the release disagrees; a night where the
# framework itself refuses cases shows them by reason. Bad settings are refused with one line.
#   nightly_real.sh TALLY MODEL_WORKER DIR
set -u
tally=$1; worker=$2; dir=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$dir"; mkdir -p "$dir"
fail() { echo "FAIL: $*"; echo "--- out"; cat "$dir/out"; exit 1; }
TALLY=$tally TALLY_NIGHT=$dir/night TALLY_NIGHT_TARGETS=megatron-core TALLY_NIGHT_WORLDS=2 TALLY_NIGHT_CAMPAIGN=4s \
  TALLY_NIGHT_SEED=3 TALLY_TEST_WORKER_FAULT=no-dedup-filter \
  "$root/ci/nightly-real" -- --worker "$worker $tally {world}" >"$dir/out" 2>&1
rc=$?
[ $rc = 1 ] || fail "exit code $rc, expected 1 (new failures)"
index=$dir/night/index.html
[ -f "$index" ] || fail "no index.html"
grep -q 'href="megatron-core-world2/sweep-html/index.html"' "$index" || fail "the index does not link the sweep's report"
grep -Eq '<h2>New: [1-9][0-9]*</h2>' "$index" || fail "the index lists no new failure"
grep -q '<td>campaign</td>' "$index" || fail "the index lists none of the campaign's failures"
grep -Eq "<h2>tally's model and the release disagree: [1-9][0-9]*</h2>" "$index" ||
  fail "the index lists no disagreement of tally's model and the release"
# Every link points at a file of the night.
grep -o 'href="[^"]*"' "$index" | sed 's/href="//; s/"$//' | while read -r target; do
  [ -e "$dir/night/$target" ] || { echo "FAIL: the index links $target, which is not there"; exit 1; }
done || exit 1
# Where a Chromium is installed, the browser opens the index and builds the same tables.
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -n "$browser" ]; then
  timeout 120 "$browser" --headless --no-sandbox --disable-gpu --user-data-dir="$dir/profile" \
    --dump-dom "file://$index" 2>/dev/null >"$dir/dom.html"
  grep -Eq '<h2>New: [1-9][0-9]*</h2>' "$dir/dom.html" || fail "Chromium's page of the index lists no new failure"
  [ "$(grep -o '<tr' "$dir/dom.html" | wc -l)" = "$(grep -o '<tr' "$index" | wc -l)" ] ||
    fail "Chromium built another number of table rows than the index has"
fi
# A night where the framework itself refuses every third case: shown by reason, on the console and
# in the index, apart from tally's rules' refusals. (Every third, not every other: a campaign bound
# by time runs an odd number of cases as often as an even one, and more than half refused is a
# night that checked nothing, exit 3.)
TALLY=$tally TALLY_NIGHT=$dir/refusing TALLY_NIGHT_TARGETS=megatron-core TALLY_NIGHT_WORLDS=2 TALLY_NIGHT_CAMPAIGN=3s \
  TALLY_NIGHT_SEED=3 TALLY_TEST_WORKER_MODE=refuse-thirds \
  "$root/ci/nightly-real" -- --worker "$worker $tally {world}" >"$dir/refusing.out" 2>&1
rc=$?
[ $rc = 0 ] || fail "the refusing night exited $rc: $(tail -5 "$dir/refusing.out")"
grep -q "^  refused by the framework [0-9]*x: megatron-core 0.19.2 refused it as it set it up: rank 0: ValueError: the framework declines every third case" \
  "$dir/refusing.out" || fail "the night's console does not show the sweep's refusals by reason: $(cat "$dir/refusing.out")"
grep -q "^  refused [0-9]*x by megatron-core 0.19.2: ValueError: the framework declines every third case" "$dir/refusing.out" ||
  fail "the night's console does not show the campaign's refusals by reason: $(cat "$dir/refusing.out")"
grep -Eq '<h2>Refused by the framework itself: [1-9][0-9]*</h2>' "$dir/refusing/index.html" ||
  fail "the index does not list the framework's refusals"
grep -q 'the framework declines every third case' "$dir/refusing/index.html" || fail "the index does not give the framework's reason"
TALLY=$tally TALLY_NIGHT_WORLDS="2 x" TALLY_NIGHT_TARGETS=megatron-core "$root/ci/nightly-real" >"$dir/bad.out" 2>&1
[ $? = 2 ] && grep -q "TALLY_NIGHT_WORLDS '2 x': 'x' is not a world" "$dir/bad.out" || fail "a bad world was not refused: $(cat "$dir/bad.out")"
echo "ok: the night's failures and disagreements, linked from one index${browser:+, opened in $($browser --version 2>/dev/null | head -1)}"
