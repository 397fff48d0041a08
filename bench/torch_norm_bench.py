#!/usr/bin/env python3
"""PyTorch's multi-tensor and flat L2 norms on the shards that bench/gpu_norm_bench.cu uses.

Reads the sizes file that `gpu_norm_bench --sizes-out FILE` writes (one "name numel" line per
tensor, in buffer order), allocates one flat bf16 buffer of the total size filled with random
normal values, and times, each as the median of --reps runs (CUDA events) after 3 warm-ups:
  foreach   torch._foreach_norm(views, 2, dtype=float32) then torch.linalg.vector_norm of the
            stacked per-tensor norms (what a trainer's clip_grad_norm_ does on a list of grads)
  flat      torch.linalg.vector_norm(flat, dtype=float32) over the one flat tensor
  copy      dst.copy_(flat): PyTorch's device-to-device copy, bandwidth = (read + write) / time
The views are slices of the flat buffer, as a contiguous gradient buffer holds them.

Usage: python3 bench/torch_norm_bench.py SIZES_FILE [--reps N] [--json OUT.json]
"""
import argparse
import json
import statistics
import sys

import torch


def median_ms(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args()

    with open(args.sizes) as f:
        sizes = [int(line.split()[1]) for line in f if line.strip()]
    total = sum(sizes)
    if not torch.cuda.is_available():
        print("torch_norm_bench: no CUDA device", file=sys.stderr)
        return 3
    device = torch.device("cuda")
    torch.manual_seed(0)
    flat = torch.randn(total, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(flat)
    views = list(torch.split(flat, sizes))
    nbytes = flat.numel() * flat.element_size()

    def foreach():
        norms = torch._foreach_norm(views, 2, dtype=torch.float32)
        return torch.linalg.vector_norm(torch.stack(norms))

    def flat_norm():
        return torch.linalg.vector_norm(flat, dtype=torch.float32)

    def copy():
        dst.copy_(flat)

    reference = torch.sum(flat.double() ** 2).item()
    results = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
               "tensors": len(sizes), "elements": total, "bytes": nbytes}
    copy_ms = median_ms(copy, args.reps)
    results["copy_ms"] = copy_ms
    results["copy_GBps"] = 2 * nbytes / (copy_ms * 1e-3) / 1e9
    print(f"torch {torch.__version__} on {results['device']}: {len(sizes)} tensors, "
          f"{total} bf16 elements")
    print(f"copy   dst.copy_(flat)                       {copy_ms:9.4f} ms "
          f"{results['copy_GBps']:8.1f} GB/s (read + write)")
    for name, fn, label in (("foreach", foreach, "_foreach_norm + stack + vector_norm"),
                            ("flat", flat_norm, "linalg.vector_norm(flat)")):
        ms = median_ms(fn, args.reps)
        value = fn().item()
        rel = abs(value * value - reference) / reference
        gbps = nbytes / (ms * 1e-3) / 1e9
        results[name + "_ms"] = ms
        results[name + "_GBps"] = gbps
        results[name + "_rel_err_sumsq"] = rel
        print(f"{name:6s} {label:38s} {ms:9.4f} ms {gbps:8.1f} GB/s read "
              f"({100 * gbps / results['copy_GBps']:5.1f}% of copy), "
              f"rel. err of norm^2 {rel:.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
