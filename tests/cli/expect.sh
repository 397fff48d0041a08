#!/usr/bin/env bash
# Black-box check of one tally invocation: expect.sh RC REGEX COMMAND...
# Passes when the command exits with RC and its combined output matches the extended REGEX
# (grep -E, multi-line output searched line by line). For RC 2 (bad input) stderr must be
# exactly one line.
set -u
want_rc=$1; regex=$2; shift 2
out=$(mktemp); err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
"$@" >"$out" 2>"$err"
rc=$?
fail() { echo "FAIL: $*"; echo "command: $*"; echo "--- stdout"; head -c 4000 "$out"; echo "--- stderr"; cat "$err"; exit 1; }
[ "$rc" = "$want_rc" ] || fail "exit code $rc, expected $want_rc"
cat "$out" "$err" | grep -Eq -- "$regex" || fail "output does not match /$regex/"
# (mpirun adds its own lines about non-zero exits: the mpi tests set TALLY_EXPECT_ANY_STDERR=1.)
if [ "$want_rc" = 2 ] && [ "${TALLY_EXPECT_ANY_STDERR:-0}" != 1 ]; then
  [ "$(wc -l <"$err")" = 1 ] || fail "bad input must print exactly one line on stderr"
fi
echo "ok: exit $rc, output matches /$regex/"
