#!/usr/bin/env python3
"""Runs the commands that docs/findings/*.md show in ```console blocks and checks that each prints
the lines the write-up shows under it, so a write-up never drifts from its reproducer.

A block is a fenced block whose info string starts with `console`. In it, a line starting with `$ `
is a command (a trailing `\\` continues it on the next line; leading `NAME=value` words set its
environment), run from the repository root; the
lines after it, up to the next command or the end of the block, are output it must print, each
equal to a whole line of some rank's stdout (`...` stands for lines left out). Every command's shown
output holds `DEFECT SHOWN: ...` lines or `DEFECT ABSENT: ...` lines (not both): the command must
exit 1 with the first and 0 with the second. `torchrun` (or `python3 -m torch.distributed.run`) is run as this
Python's torch.distributed.run, each rank's stdout to its own file, so ranks' lines never interleave.

The info string's second word says what the block needs:
- none: CPUs (DeepSpeed's CPU accelerator and gloo; CUDA hidden). CI runs these.
- `fp16`: fp16 on the device: a GPU with --gpu, else CPUs that have fp16 (skipped where they have not).
- `gpu`: a GPU (--gpu), with the framework the script imports.
- `megatron-cpu`: CPUs (gloo; CUDA hidden) where megatron-core imports (it needs Python 3.12, so not
  in CI's environment: skipped, saying so, where it does not import).
- `hf-cpu`: CPUs (gloo; CUDA hidden) where transformers 5.17.0 and accelerate import (ci/real-hf runs
  these in ci/hf-venv's environment; skipped, saying so, elsewhere).

Every reproducer in docs/findings/ must appear in some block (not checked with --only). Exit 0 when every block run passed, 1
when one failed, 2 on a write-up this script cannot read.
"""
import argparse
import glob
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FINDINGS = os.path.join(ROOT, "docs", "findings")
MARKER = re.compile(r"^DEFECT (SHOWN|ABSENT): ")


def blocks(path):
    """(line number, needs, [(command, [expected lines])]) for each console block of a write-up."""
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        fence = re.match(r"^(```+)console\b(.*)$", lines[i])
        if not fence:
            i += 1
            continue
        start, needs, body = i + 1, (fence.group(2).split() or ["cpu"])[0], []
        i += 1
        while i < len(lines) and not lines[i].startswith(fence.group(1)):
            body.append(lines[i])
            i += 1
        i += 1
        commands, j = [], 0
        while j < len(body):
            if not body[j].startswith("$ "):
                raise SystemExit(f"{path}:{start + j + 1}: output before any command in a console block")
            command = body[j][2:]
            while command.endswith("\\"):
                j += 1
                command = command[:-1] + " " + body[j].strip()
            j += 1
            expected = []
            while j < len(body) and not body[j].startswith("$ "):
                if body[j].strip() and body[j].strip() != "...":
                    expected.append(body[j].rstrip())
                j += 1
            kinds = {MARKER.match(e).group(1) for e in expected if MARKER.match(e)}
            if len(kinds) != 1:
                raise SystemExit(f"{path}:{start}: `{command}` must show DEFECT SHOWN or DEFECT ABSENT lines, "
                                 f"not {sorted(kinds) or 'none'}")
            commands.append((command, expected))
        yield start, needs, commands


def argv_of(command):
    """(env, torchrun's arguments or None, the plain argv or None) of a shown command."""
    words = shlex.split(command)
    env = {}
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if words[:1] == ["torchrun"]:
        rest = words[1:]
    elif words[:3] in (["python3", "-m", "torch.distributed.run"], ["python", "-m", "torch.distributed.run"]):
        rest = words[3:]
    else:
        return env, None, words
    return env, rest, None


def fp16_on_cpu():
    try:
        import torch

        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except Exception:
        return False


def megatron_imports():
    try:
        import megatron.core.parallel_state  # noqa: F401

        return True
    except Exception:
        return False


def hf_imports():
    """Whether the Hugging Face write-ups' stack imports: transformers 5.17.0 with accelerate."""
    try:
        import accelerate  # noqa: F401
        import transformers

        return transformers.__version__ == "5.17.0"
    except Exception:
        return False


def run(command, on_gpu, timeout):
    """The command's exit status, the ranks' stdout lines (rank order) and its other output."""
    shown_env, rest, plain = argv_of(command)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if not on_gpu:
        env.update(DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="")
    env.update(shown_env)
    with tempfile.TemporaryDirectory(prefix="findings-") as logs:
        if rest is None:
            argv = plain
        else:
            argv = [sys.executable, "-m", "torch.distributed.run", "--log-dir", logs, "--redirects", "3"] + rest
        try:
            done = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  timeout=timeout, text=True)
            status, other = done.returncode, done.stdout
        except subprocess.TimeoutExpired as e:
            status, other = "timeout", (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        out = []
        if rest is None:
            out = other.split("\n")
        else:
            files = glob.glob(os.path.join(logs, "**", "stdout.log"), recursive=True)
            for f in sorted(files, key=lambda f: int(os.path.basename(os.path.dirname(f)))):
                out += open(f, encoding="utf-8", errors="replace").read().split("\n")
                err = os.path.join(os.path.dirname(f), "stderr.log")
                if os.path.exists(err):
                    other += open(err, encoding="utf-8", errors="replace").read()
    return status, [line.rstrip() for line in out], other


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu", action="store_true", help="also run the fp16 and gpu blocks on this machine's GPU")
    p.add_argument("--only", default="", help="run only commands containing this text")
    p.add_argument("--timeout", type=float, default=600, help="seconds a command may take")
    p.add_argument("--list", action="store_true", help="list the commands and exit")
    args = p.parse_args()

    writeups = sorted(glob.glob(os.path.join(FINDINGS, "*.md")))
    found = [(os.path.relpath(w, ROOT), start, needs, commands)
             for w in writeups for start, needs, commands in blocks(w)]
    scripts = sorted(os.path.relpath(s, ROOT) for s in glob.glob(os.path.join(FINDINGS, "*.py")))
    shown = " ".join(c for _, _, _, commands in found for c, _ in commands)
    unshown = [s for s in scripts if s not in shown]

    fp16 = args.gpu or fp16_on_cpu()
    megatron = megatron_imports()
    hf = hf_imports()
    passed, failed, skipped = 0, [], []
    start_all = time.time()
    for writeup, line, needs, commands in found:
        for command, expected in commands:
            if args.only not in command:
                continue
            where = f"{writeup}:{line}"
            if args.list:
                print(f"{where} [{needs}] $ {command}")
                continue
            if (needs == "gpu" and not args.gpu) or (needs == "fp16" and not fp16) or \
                    (needs == "megatron-cpu" and not megatron) or (needs == "hf-cpu" and not hf):
                skipped.append(f"{where} [{needs}] $ {command}")
                continue
            started = time.time()
            status, out, other = run(command, on_gpu=args.gpu and needs not in ("cpu", "megatron-cpu", "hf-cpu"),
                                     timeout=args.timeout)
            missing = [e for e in expected if e not in out]
            want = 1 if any(e.startswith("DEFECT SHOWN") for e in expected) else 0
            took = time.time() - started
            if missing or status != want:
                failed.append(where)
                print(f"FAIL {where} ({took:.0f} s) $ {command}")
                if status != want:
                    print(f"  exit status {status}, the write-up's DEFECT line means {want}")
                for e in missing:
                    print(f"  not printed: {e}")
                print("  the ranks printed:")
                for o in out:
                    if o:
                        print(f"    {o}")
                print("  the end of the other output:")
                for o in other.strip().split("\n")[-15:]:
                    print(f"    {o}")
            else:
                passed += 1
                print(f"ok   {where} ({took:.0f} s) $ {command}", flush=True)
    if unshown and not args.only:
        failed.append("coverage")
        print(f"FAIL no write-up shows a run of {', '.join(unshown)}")
    if args.list:
        return 1 if unshown else 0
    for s in skipped:
        print(f"skip {s}")
    print(f"findings-reproducers: {passed} passed, {len(failed)} failed, {len(skipped)} skipped "
          f"(gpu blocks need --gpu; fp16 ones a device with fp16; megatron-cpu ones megatron-core; hf-cpu ones "
          f"transformers 5.17.0 with accelerate) in "
          f"{time.time() - start_all:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
