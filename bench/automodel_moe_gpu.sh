#!/usr/bin/env bash
# NeMo-Automodel's Qwen3-MoE and GPT-OSS on the GPU machine, where they build as they are (their rotary
# embedding goes on cuda:current_device(), qwen3_moe/model.py:184, gpt_oss/model.py:160; the worker
# refuses MoE where it sees no GPU).
# Needs nemo-automodel 0.7.0 and the transformers 5.18.0 it pins importable beside this checkout's
# adapters (PYTHONPATH; the GPU machine's own torch 2.11). One after another, within about six
# minutes on one H100 or H200 over gloo:
#   1. one Qwen3-MoE case at world 4, EP 2 (tally's qwen3-moe preset), and one at world 8, EP 4; the
#      same for GPT-OSS (tally's gpt-oss preset);
#   2. the three expert plants through `tally mutants` at world 4;
#   3. a world-4 campaign against the known findings (about a third of its cases MoE).
#
#   bench/automodel_moe_gpu.sh TALLY OUTDIR
set -u
tally=${1:?usage: automodel_moe_gpu.sh TALLY OUTDIR}
out=${2:?usage: automodel_moe_gpu.sh TALLY OUTDIR}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
python3 -c 'import nemo_automodel, transformers, torch; print("nemo-automodel", nemo_automodel.__version__,
  "transformers", transformers.__version__, "torch", torch.__version__, "cuda", torch.cuda.is_available())' \
  > "$out/versions.txt" 2>&1
cat "$out/versions.txt"
for preset in qwen3-moe gpt-oss; do
  for args in "--world 4 --ep 2" "--world 8 --ep 4"; do
    echo "== tally run --target automodel --preset $preset $args"
    # shellcheck disable=SC2086
    timeout 200 "$tally" run --target automodel --preset $preset $args --case-timeout 150s 2>&1 | tail -14
  done
done > "$out/runs.txt"
cat "$out/runs.txt"
timeout 300 "$tally" mutants --target automodel --world 4 --budget 20 --case-timeout 120s \
  --faults missing-ep-reduction,expert-norm-dropped,clip-per-ep-group-norm --corpus "$out/mutants" \
  > "$out/mutants.txt" 2>&1
echo "rc=$?" >> "$out/mutants.txt"
tail -6 "$out/mutants.txt"
timeout 200 "$tally" fuzz --target automodel --world 4 --time 120s --seed 5204 --known "$here/seeds/real" \
  --shrink-runs 0 --case-timeout 120s --corpus "$out/campaign" > "$out/campaign.txt" 2>&1
echo "rc=$?" >> "$out/campaign.txt"
sed -n '/^summary/,$p' "$out/campaign.txt"
