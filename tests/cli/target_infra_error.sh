#!/usr/bin/env bash
# target_infra_error.sh TALLY WORKER DIR: `tally fuzz --target` with a worker that reports an
# error, dies, or hangs (tests/run/model_worker.sh's modes). Each is an infrastructure error: exit
# 3 soon (no shrinking), "0 failures", the worker's message and log tail in the text summary, in
# --json and in the corpus next to the saved case (the queue folder is gone), and no process of
# the worker left behind, its child in a session of its own included.
set -u
tally=$1; worker=$2; dir=$3
rm -rf "$dir"; mkdir -p "$dir"
fail() { echo "FAIL: $*"; for f in "$dir"/*.out "$dir"/*.err; do echo "--- $f"; head -c 3000 "$f"; done; exit 1; }
stand_in="$worker $tally {world}"

for mode in error die hang; do
  start=$(date +%s)
  TALLY_TEST_WORKER_MODE=$mode TALLY_TEST_WORKER_DETACHED=1 "$tally" fuzz --target megatron-core \
    --worker "$stand_in" --world 2 --time 30s --seed 3 --case-timeout 1s --corpus "$dir/$mode" \
    >"$dir/$mode.out" 2>"$dir/$mode.err"
  rc=$?
  took=$(( $(date +%s) - start ))
  [ $rc = 3 ] || fail "$mode: exit code $rc, expected 3 (an infrastructure error)"
  [ $took -le 8 ] || fail "$mode: took $took s (the campaign must stop at the error, unshrunk)"
  grep -q "^summary: 1 cases in .*, 0 failures, seed 3, stopped by an infrastructure error (exit 3)$" "$dir/$mode.out" ||
    fail "$mode: the summary does not say an infrastructure error stopped it"
  case $mode in
    error) why="megatron-core 0.19.2: the framework refused the case \(as asked\)" ;;
    die) why="megatron-core worker \(world 2\): the worker exited during case-1" ;;
    hang) why="megatron-core worker \(world 2\): case-1 gave no result within 1 s \(--case-timeout; the worker was stopped\)" ;;
  esac
  grep -Eq "^infrastructure error at case 0: $why" "$dir/$mode.out" || fail "$mode: no line naming what the worker did"
  grep -q "^    model_worker.sh: case 1$" "$dir/$mode.out" || fail "$mode: the summary lacks the end of the worker's log"
  [ -f "$dir/$mode/3-0.infra-error.json" ] || fail "$mode: the case is not saved"
  grep -q '"outcome": "infra-error"' "$dir/$mode/3-0.infra-error.json" || fail "$mode: the saved case does not expect an infra-error"
  grep -Eq "^$why" "$dir/$mode/3-0.infra-error.txt" || fail "$mode: the corpus lacks the message"
  grep -q "model_worker.sh: case 1" "$dir/$mode/3-0.infra-error.txt" || fail "$mode: the corpus lacks the log tail"
  ls "$dir/$mode" | grep -q shrunk && fail "$mode: an infrastructure error was shrunk"
done

# --json: the message with the log tail.
TALLY_TEST_WORKER_MODE=die "$tally" fuzz --target megatron-core --worker "$stand_in" --world 2 --cases 5 \
  --seed 3 --corpus "$dir/json" --json >"$dir/json.out" 2>"$dir/json.err"
rc=$?
[ $rc = 3 ] || fail "json: exit code $rc, expected 3"
grep -q '"stopped_by":"infra-error",.*"failures":\[\],"new":0,"known":0,"infra_error":{"case":0,"while_shrinking":false,"call":"megatron-core worker (world 2)","message":"the worker exited during case-1; the end of its log .*model_worker.sh: case 1","saved":"[^"]*3-0.infra-error.json","message_file":"[^"]*3-0.infra-error.txt"}' "$dir/json.out" ||
  fail "json: no infra_error with the message, its log tail and the saved files"

# The detached children (one per worker start) are gone: each mode wrote its pid in its queue,
# which the pool removed, so a worker-dir run keeps them to look at.
TALLY_TEST_WORKER_MODE=die TALLY_TEST_WORKER_DETACHED=1 "$tally" fuzz --target megatron-core --worker "$stand_in" \
  --world 2 --cases 5 --seed 3 --corpus "$dir/kept" --worker-dir "$dir/queues" >"$dir/kept.out" 2>"$dir/kept.err"
child=$(cat "$dir/queues/world-2/detached.pid")
[ -n "$child" ] || fail "the stand-in wrote no pid of its detached child"
for _ in $(seq 50); do
  state=$(sed 's/.*) //' "/proc/$child/stat" 2>/dev/null | cut -c1)
  [ -z "$state" ] || [ "$state" = Z ] && break
  sleep 0.05
done
[ -z "$state" ] || [ "$state" = Z ] || fail "the worker's child in its own session ($child) outlived tally"
echo "ok: error, death and hang of the worker end in exit 3 with the message and log tail, saved, unshrunk"
