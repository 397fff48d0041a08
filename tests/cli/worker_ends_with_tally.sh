#!/usr/bin/env bash
# worker_ends_with_tally.sh TALLY QUEUE_WORKER DIR: a worker busy with a case (the stand-in on the
# real workers' queue loop, tests/run/queue_worker.py, hangs in every case) ends within a few
# seconds once tally is killed with SIGKILL, which leaves it no chance to stop the worker: each rank
# watches tally's process, also in the middle of a case.
set -u
tally=$1; queue_worker=$2; dir=$3
rm -rf "$dir"; mkdir -p "$dir"
worker_pid=
fail() {
  echo "FAIL: $*"; for f in "$dir"/*.out "$dir"/*.err "$dir"/queues/world-2/worker.log; do echo "--- $f"; head -c 3000 "$f"; done
  [ -n "$worker_pid" ] && kill -9 "$worker_pid" 2>/dev/null
  exit 1
}
running() {  # a zombie, waiting for its parent to reap it, is not running
  local state
  state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)
  [ -n "$state" ] && [ "$state" != Z ]
}

"$tally" run --world 2 --tp 2 --target megatron-core --worker "python3 $queue_worker {world}" \
  --worker-dir "$dir/queues" --case-timeout 60s >"$dir/run.out" 2>"$dir/run.err" &
tally_pid=$!
started=$dir/queues/world-2/case-1.started
for _ in $(seq 200); do [ -s "$started" ] && break; sleep 0.05; done
[ -s "$started" ] || { kill -9 "$tally_pid"; fail "the worker never started case 1"; }
worker_pid=$(cat "$started")
{ kill -9 "$tally_pid"; wait "$tally_pid"; } 2>/dev/null
for _ in $(seq 100); do running "$worker_pid" || break; sleep 0.05; done
running "$worker_pid" && fail "the worker ($worker_pid), busy with a case, outlived tally by 5 s"
grep -q "is gone: this rank exits" "$dir/queues/world-2/worker.log" || fail "the worker's log does not say why it ended"
echo "ok: a worker in the middle of a case ends once tally is killed"
