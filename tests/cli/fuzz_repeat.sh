#!/usr/bin/env bash
# fuzz_repeat.sh TALLY DIR: `tally fuzz --cases N --seed S` twice gives the same output (timings
# aside) and the same case files; the JUnit report names each failure and its replay command.
set -u
tally=$1; dir=$2
rm -rf "$dir"; mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
# Timings: "0.3s", "(512 cases/s)" and the periodic progress lines.
normalise() { sed -E '/^progress: /d; s/[0-9]+\.[0-9]+s/Ts/g; s/\([0-9]+ cases\/s\)/(R cases\/s)/'; }
run() {
  "$tally" fuzz --cases 150 --seed 5 --faults missing-pp-reduction,no-dedup-filter --max-failures 2 \
    --corpus "$dir/corpus" --junit "$dir/junit.xml" >"$dir/$1.out" 2>"$dir/$1.err"
  echo $? >"$dir/$1.rc"
}
run first
mv "$dir/corpus" "$dir/first-corpus"
mv "$dir/junit.xml" "$dir/first-junit.xml"
run second
[ "$(cat "$dir/first.rc")" = 1 ] || fail "exit code $(cat "$dir/first.rc"), expected 1 (failures found)"
[ "$(cat "$dir/second.rc")" = 1 ] || fail "second run: exit code $(cat "$dir/second.rc")"
[ ! -s "$dir/first.err" ] || fail "stderr: $(cat "$dir/first.err")"
diff <(normalise <"$dir/first.out") <(normalise <"$dir/second.out") || fail "outputs differ"
diff -r "$dir/first-corpus" "$dir/corpus" || fail "corpus files differ"
[ "$(ls "$dir/corpus" | wc -l)" = 4 ] || fail "expected 2 originals and 2 shrunk cases: $(ls "$dir/corpus")"
grep -q '^repeat: tally fuzz --seed 5 --cases 150 --faults missing-pp-reduction,no-dedup-filter --max-failures 2$' "$dir/first.out" ||
  fail "no repeat line"
grep -q 'failures="2"' "$dir/junit.xml" || fail "junit: no failures=\"2\""
grep -q "tally replay $dir/corpus/5-[0-9]*.shrunk.json" "$dir/junit.xml" || fail "junit: no replay command"
echo "ok: same output and case files; junit names both failures"
