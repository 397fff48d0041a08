#!/usr/bin/env bash
# A stand-in for a real framework's worker (run/framework_worker.h, docs/real-targets.md), for
# tests of the worker protocol where no framework is installed: each case is executed by tally's
# own model of the path (`tally run CASE --manifests DIR`), which writes the manifests a real
# worker would. It says it is megatron-core (TALLY_TEST_WORKER_VERSION, default 0.19.2) so the
# real target's rules apply, or, with TALLY_TEST_WORKER_FRAMEWORK=deepspeed, DeepSpeed 0.19.8 on a
# machine without fp16 (the case's deepspeed section is then dropped before tally's model runs it).
#
#   model_worker.sh TALLY WORLD --queue DIR --parent-pid PID
#
# TALLY_TEST_WORKER_FAULT=NAME plants that catalog fault in every case (the "framework"
# miscounts); TALLY_TEST_WORKER_RELEASE_MODEL=1 runs each case with tally's model of the release it
# says it is (`tally run --megatron-release`: the release's own miscounts, gradnorm/releases.h); TALLY_TEST_WORKER_MODE=die exits at the first case, =die-for-good does so and never
# comes up again (a later start exits before hello), =error reports an error for
# every case, =error-every-other for every odd case, =refuse-all answers every case "refused" with
# the framework's words, =refuse-without-message answers every case "refused" with an empty
# message, =refuse-failing runs each case and answers "refused" (the framework's words) where the
# run fails, leaving its manifests, =error-on-lane-1 for every case where its queue is
# under a folder lane-1 (a sweep's second lane, with --worker-dir), =refuse-odd answers every odd case "refused"
# (the framework's own check declined it at set-up: more than half of an odd number of cases),
# =refuse-thirds cases 1, 4, 7, ... (never more than half, whatever the number, past the first), =hang never answers, =no-hello exits before saying hello, =slow-start never says
# hello (and never reads its queue), =long-line prints lines of 100 KB at the first case and exits,
# =fifo-hello leaves a FIFO as hello.json, =fifo-result one as the first case's result. Hellos tally
# must refuse (docs/schemas/hello.schema.json): =hello-world-2.5 and =hello-world-2^40+2 say so as
# their world, =hello-plants-no-such-fault plants a fault the catalog lacks, =hello-unknown-key adds
# "gpu_name", =hello-version-not-a-version says its version is "not-a-versioné"; =result-unknown-key answers each case with a result holding "gpu_seconds". Modes whose
# manifests are self-consistent but not of the gradients tally sent: =other-seed runs each case with
# the next gradient seed, =stale answers each case after the first with the previous case's
# manifests, =unclipped-param records the first clipped piece of each rank as left unclipped (the
# reported coefficient stays right); =no-digest leaves out the case_digest every manifest echoes.
# At case TALLY_TEST_WORKER_AT (default 1) only, and otherwise as asked: =no-manifests answers "ok"
# without a case-K folder, =fifo-manifest leaves a FIFO as rank 0's manifest, =dev-zero-manifest a
# symbolic link to /dev/zero, =link-manifest a symbolic link to the right manifest kept elsewhere, =detach-and-die starts a child in a session of its own and exits at
# once (its pid in $queue/late.pid); =daemon leaves a double-forked daemon at every case (its pid
# added to daemon.pids in the pool's folder) and runs the case; =brief-daemon leaves one that ends by
# itself within 0.4 s (its pid there too), waits 0.8 s and runs the case; =retire runs the case,
# writes `retiring` before its result and exits 0.3 s after it (as a worker short of threads),
# =retire-and-linger does so and never exits; =flood prints 160 MB of output at
# every case and runs it. With
# TALLY_TEST_WORKER_DETACHED=1 it first starts a child in a session of its own (as torchrun starts
# its ranks), writing the child's pid to $queue/detached.pid.
set -u
tally=$1
world=$2
shift 2
queue= parent=
while [ $# -gt 0 ]; do
  case $1 in
    --queue) queue=$2; shift 2 ;;
    --parent-pid) parent=$2; shift 2 ;;
    *) echo "model_worker.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
mode=${TALLY_TEST_WORKER_MODE:-}
at=${TALLY_TEST_WORKER_AT:-1}
framework=${TALLY_TEST_WORKER_FRAMEWORK:-megatron-core}
version=0.19.2 dtypes=
# As megatron-core it runs tally's model, which models DDP's path after its reduction, so it declines
# Megatron-FSDP, the layer-wise parameter layout and gradients that enter before the reduction.
declines=
[ "$framework" = megatron-core ] && declines=', "cannot_run": {"megatron_fsdp": "the stand-in runs tally'"'"'s model of DDP'"'"'s path", "optimizer.layer_wise_param_layout": "the stand-in runs tally'"'"'s model, which has no layer-wise parameter layout", "gradients.enter": "the stand-in runs tally'"'"'s model, which has no reduction stage"}'
# As DeepSpeed it still builds what tally's model of Megatron builds: no expert biases with expert TP.
if [ "$framework" = deepspeed ]; then version=0.19.8 dtypes=', "dtypes": ["fp32", "bf16"], "model_rules": "megatron"'; fi
fault=${TALLY_TEST_WORKER_FAULT:-}
if [ "${TALLY_TEST_WORKER_DETACHED:-}" = 1 ]; then
  setsid sleep 300 </dev/null >/dev/null 2>&1 &
  echo $! >"$queue/detached.pid"
fi
case $mode in
  slow-start) exec sleep 3600 ;;
  fifo-hello) mkfifo "$queue/hello.json"; exec sleep 3600 ;;
esac
# The pool's folder holds every start's queue: a mark there outlives this start.
if [ "$mode" = die-for-good ] && [ -e "$(dirname "$queue")/died" ]; then
  echo "model_worker.sh: died for good, as asked"
  exit 4
fi
if [ "$mode" = no-hello ]; then
  echo "model_worker.sh: leaving before hello, as asked"
  echo "ValueError: device_id cuda:1 is out of range (as a rank's own error)"
  for i in $(seq 30); do echo "    the launcher's report, line $i"; done
  exit 4
fi

atomically() {  # atomically FILE TEXT
  printf '%s\n' "$2" >"$1.tmp" && mv "$1.tmp" "$1"
}
# It "plants" a case's faults by running tally's model with them; two it declines, as a real
# worker declines faults without a counterpart.
hello_world=$world plants= extra=
case $mode in
  hello-world-2.5) hello_world=2.5 ;;
  hello-world-2^40+2) hello_world=1099511627778 ;;
  hello-plants-no-such-fault) plants=', "no-such-fault": "a name the catalog lacks"' ;;
  hello-unknown-key) extra=', "gpu_name": "NVIDIA H200"' ;;
  hello-version-not-a-version) version='not-a-version\u00e9' ;;
esac
atomically "$queue/hello.json" \
  "{\"framework\": \"$framework\", \"version\": \"${TALLY_TEST_WORKER_VERSION:-$version}\", \"world\": $hello_world, \"producer\": \"tally model_worker.sh\"$dtypes$declines,
    \"plants\": {\"average-rank-norms\": \"tally's model\", \"missing-pp-reduction\": \"tally's model\", \"no-dedup-filter\": \"tally's model\"$plants},
    \"cannot_plant\": {\"zero-count-in-float32\": \"too big for the stand-in\"}$extra}"
echo "model_worker.sh: world $world up"

k=1
while :; do
  [ -e "$queue/stop" ] && exit 0
  kill -0 "$parent" 2>/dev/null || exit 0
  request=$queue/case-$k.json
  if [ ! -e "$request" ]; then
    sleep 0.01
    continue
  fi
  echo "model_worker.sh: case $k"
  for f in gradients.json gradients.f32; do
    if [ ! -e "$queue/case-$k.$f" ]; then
      atomically "$queue/case-$k.result.json" "{\"status\": \"error\", \"message\": \"case-$k.$f is missing\"}"
      k=$((k + 1))
      continue 2
    fi
  done
  case $mode in
    daemon) sh -c 'setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! >>"$1"' sh "$(dirname "$queue")/daemon.pids" ;;
    brief-daemon)
      sh -c 'setsid sleep 0.4 </dev/null >/dev/null 2>&1 & echo $! >>"$1"' sh "$(dirname "$queue")/daemon.pids"
      sleep 0.8 ;;
    flood) head -c 160000000 /dev/zero | tr '\0' 'x'; printf '\nmodel_worker.sh: flooded at case %s\n' "$k" ;;
  esac
  if [ "$k" = "$at" ]; then
    case $mode in
      detach-and-die)
        setsid sleep 300 </dev/null >/dev/null 2>&1 &
        echo $! >"$queue/late.pid"
        exit 5 ;;
      no-manifests)
        atomically "$queue/case-$k.result.json" '{"status": "ok"}'
        k=$((k + 1))
        continue ;;
    esac
  fi
  case $mode in
    die) exit 5 ;;
    die-for-good) : >"$(dirname "$queue")/died"; exit 5 ;;
    long-line)
      # A progress bar without newlines, then a Python error as long.
      head -c 100000 /dev/zero | tr '\0' '#'
      printf '\nValueError: '
      head -c 100000 /dev/zero | tr '\0' 'x'
      printf '\n'
      exit 5 ;;
    fifo-result) mkfifo "$queue/case-$k.result.json"; sleep 3600 ;;
    hang) sleep 3600 ;;
    error)
      atomically "$queue/case-$k.result.json" '{"status": "error", "message": "the framework refused the case (as asked)"}'
      k=$((k + 1))
      continue ;;
    refuse-odd | refuse-thirds)
      every=2 which="odd cases"
      [ "$mode" = refuse-thirds ] && every=3 which="every third case"
      if [ $((k % every)) = 1 ]; then
        atomically "$queue/case-$k.result.json" '{"status": "refused", "message": "rank 0: ValueError: the framework declines '"$which"' (as asked)"}'
        k=$((k + 1))
        continue
      fi ;;
    error-on-lane-1)
      case $queue in
        */lane-1/*)
          atomically "$queue/case-$k.result.json" '{"status": "error", "message": "lane 1'"'"'s framework fails (as asked)"}'
          k=$((k + 1))
          continue ;;
      esac ;;
    refuse-all)
      atomically "$queue/case-$k.result.json" '{"status": "refused", "message": "rank 0: AssertionError: the framework declines every case (as asked)"}'
      k=$((k + 1))
      continue ;;
    refuse-without-message)
      atomically "$queue/case-$k.result.json" '{"status": "refused", "message": ""}'
      k=$((k + 1))
      continue ;;
    error-every-other)
      if [ $((k % 2)) = 1 ]; then
        atomically "$queue/case-$k.result.json" '{"status": "error", "message": "the framework failed on an odd case (as asked)"}'
        k=$((k + 1))
        continue
      fi ;;
  esac
  # What tally sent besides the case, kept for tests (the pool removes the request's files).
  [ -e "$queue/case-$k.engine.json" ] && cp "$queue/case-$k.engine.json" "$queue/case-$k.engine.seen.json"
  planted=$queue/case-$k.planted.json
  if [ -n "$fault" ]; then
    sed "s/\"faults\": \[\]/\"faults\": [\"$fault\"]/" "$request" >"$planted"
  else
    cp "$request" "$planted"
  fi
  if [ "$framework" = deepspeed ]; then
    grep -q '"dtype": "fp16"' "$planted" && {
      atomically "$queue/case-$k.result.json" '{"status": "error", "message": "fp16 on a machine without it"}'
      k=$((k + 1))
      continue
    }
    python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c.pop("deepspeed", None); json.dump(c, open(sys.argv[1], "w"))' "$planted"
  fi
  [ "$mode" = other-seed ] && python3 -c 'import json, sys
c = json.load(open(sys.argv[1])); c["gradients"]["seed"] += 1; json.dump(c, open(sys.argv[1], "w"))' "$planted"
  release_rules=()
  [ "${TALLY_TEST_WORKER_RELEASE_MODEL:-}" = 1 ] && release_rules=(--megatron-release "${TALLY_TEST_WORKER_VERSION:-$version}")
  "$tally" run "$planted" "${release_rules[@]}" --manifests "$queue/case-$k" >"$queue/case-$k.log" 2>&1
  rc=$?
  # Every manifest echoes the request's case_digest (docs/real-targets.md).
  digest=$(sed -n 's/^ *"case_digest": "\([0-9a-f]*\)",$/\1/p' "$queue/case-$k.gradients.json")
  [ "$mode" = no-digest ] ||
    sed -i "s/^  \"tally_manifest\": \([0-9]\),\$/  \"tally_manifest\": \1,\n  \"case_digest\": \"$digest\",/" \
      "$queue/case-$k"/rank-*.json
  if [ "$k" = "$at" ]; then
    case $mode in
      fifo-manifest) rm -f "$queue/case-$k/rank-0.json" && mkfifo "$queue/case-$k/rank-0.json" ;;
      dev-zero-manifest) rm -f "$queue/case-$k/rank-0.json" && ln -s /dev/zero "$queue/case-$k/rank-0.json" ;;
      link-manifest)
        mv "$queue/case-$k/rank-0.json" "$queue/rank-0.elsewhere.json" &&
          ln -s "$queue/rank-0.elsewhere.json" "$queue/case-$k/rank-0.json" ;;
    esac
  fi
  if [ "$mode" = stale ]; then
    rm -rf "$queue/next-stale" && cp -r "$queue/case-$k" "$queue/next-stale"
    if [ -d "$queue/stale" ]; then rm -rf "$queue/case-$k" && cp -r "$queue/stale" "$queue/case-$k"; fi
    rm -rf "$queue/stale" && mv "$queue/next-stale" "$queue/stale"
  fi
  [ "$mode" = unclipped-param ] && python3 -c 'import glob, json, sys
for f in glob.glob(sys.argv[1] + "/rank-*.json"):
    m = json.load(open(f))
    pieces = [p for o in m["optimizers"] for p in o["main_params"] if p.get("clipped_stats", p["stats"]) != p["stats"]]
    if pieces:
        pieces[0]["clipped_stats"] = pieces[0]["stats"]
        json.dump(m, open(f, "w"))' "$queue/case-$k"
  case $mode in retire | retire-and-linger) [ "$k" = "$at" ] && atomically "$queue/retiring" "each rank holds 600 threads (as asked)" ;; esac
  if [ "$mode" = result-unknown-key ]; then
    atomically "$queue/case-$k.result.json" '{"status": "ok", "gpu_seconds": 1.5}'
  elif [ "$mode" = refuse-failing ] && [ $rc = 1 ]; then
    atomically "$queue/case-$k.result.json" '{"status": "refused", "message": "rank 0: ValueError: the framework declines a case it ran and failed (as asked)"}'
  elif [ $rc -le 1 ]; then
    atomically "$queue/case-$k.result.json" '{"status": "ok"}'
  else
    atomically "$queue/case-$k.result.json" "{\"status\": \"error\", \"message\": \"tally run exited $rc\"}"
  fi
  rm -f "$planted" "$queue/case-$k.log"
  if [ -e "$queue/retiring" ]; then
    [ "$mode" = retire-and-linger ] && exec sleep 3600
    sleep 0.3
    exit 0
  fi
  k=$((k + 1))
done
