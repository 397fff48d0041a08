#!/usr/bin/env bash
# A real target's sweep held against tally's model of its release: the stand-in worker says it is
# megatron-core 0.19.2 but counts right, so on the layer-wise optimizer's expert biases (#6099)
# the model of 0.19.2 predicts a miscount the "release" does not make. Those two cases, and only
# they, are reported (live, in the summary, the state's JSON and the HTML index); the exit code
# stays the release's own (it passed).
#   sweep_release_model.sh TALLY MODEL_WORKER DIR
set -u
tally=$1; worker=$2; dir=$3
rm -rf "$dir"; mkdir -p "$dir"
fail() { echo "FAIL: $*"; echo "--- stdout"; cat "$dir/out"; exit 1; }
"$tally" sweep --world 2 --features moe-expert-biases --target megatron-core --worker "$worker $tally {world}" \
  --corpus "$dir/corpus" --html "$dir/html" --no-known >"$dir/out" 2>"$dir/err"
rc=$?
[ $rc = 0 ] || fail "exit code $rc, expected 0 (the release passed every case)"
grep -q "^  tally's model of megatron-core 0.19.2 (gradnorm/releases.h): held against 30 cases, disagrees on 2$" "$dir/out" ||
  fail "no summary of the model held against the release"
[ "$(grep -c '^MODEL ' "$dir/out")" = 2 ] || fail "not two live MODEL lines"
[ "$(grep -c '^  MODEL ' "$dir/out")" = 2 ] || fail "not two MODEL lines in the summary"
grep -Eq "^  MODEL L007-moe-expert-biases-layerwise: tally's model: fail: ledger \(expert-[a-z-]+\), l2 \([0-9]+ params miscounted: decoder\.layers\.0\.mlp\.experts\.local_experts\.[0-9]+\.linear_fc[12]\.(weight|bias) counted [0-9]+ of [0-9]+[,)].*; the release: pass$" "$dir/out" ||
  fail "the disagreement does not say what the model predicted and what the release gave"
python3 - "$dir/corpus/sweep-state.json" <<'PY' || fail "the state's JSON does not hold the model's verdicts"
import json, sys
everything = json.load(open(sys.argv[1]))["results"]
# The stand-in declines Megatron-FSDP and gradients before megatron-core's own reduction (its
# hello's cannot_run), of which tally has no model, and megatron-core refuses the layer-wise
# parameter layout with expert biases. (The distributed optimizer with two instances, on the
# layouts that allow them, is held against the model too.)
refused = [r for r in everything if r["outcome"] == "refused"]
fsdp = [r for r in refused if "-fsdp-" in r["id"] and "megatron_fsdp" in r["detail"]]
unreduced = [r for r in refused if "-unreduced" in r["id"] and r["detail"].startswith("gradients.enter before_reduction")]
layout = [r for r in refused if r["id"].endswith("-layerwise-layout") and "with expert biases" in r["detail"]]
assert (len(fsdp), len(unreduced), len(layout), len(refused)) == (68, 16, 7, 91), refused
results = [r for r in everything if r["outcome"] != "refused"]
assert len(results) == 30 and all(r.get("model_checked") for r in results), "every case held against the model"
disagree = sorted(r["id"] for r in results if "model_disagrees" in r)
assert disagree == ["L007-moe-expert-biases-layerwise", "L009-moe-expert-biases-layerwise"], disagree
PY
[ "$(grep -o "class=\"pass model\"" "$dir/html/index.html" | wc -l)" = 2 ] && grep -q "model disagrees: tally&#39;s model: fail" "$dir/html/index.html" || fail "the HTML index does not mark the disagreements"
echo "ok: the two cases where tally's model of 0.19.2 and the stand-in disagree, and only they"
