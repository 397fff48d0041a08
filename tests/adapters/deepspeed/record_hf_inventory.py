#!/usr/bin/env python3
"""Records tests/adapters/deepspeed/fixtures/hf-<preset>.json, what test_hf_inventory.py compares
against: tally's layout of the preset (`tally layout --preset X --json`: its model section and
params), the params of the Hugging Face class transformers builds for it (names and shapes), each
one's logical elements as runs (tally_adapters.hf_families.recorded), and what the class does not
build. Run in DeepSpeed's environment (ci/deepspeed-venv, which has transformers) after a change to
a preset or to the mapping, and review the diff:

    $(ci/deepspeed-venv)/bin/python tests/adapters/deepspeed/record_hf_inventory.py build/cli/tally
"""

import json
import pathlib
import subprocess
import sys

from tally_adapters import hf_families


def record(tally, preset):
    layout = json.loads(subprocess.check_output([tally, "layout", "--preset", preset, "--json"]))
    model, index = layout["model"], layout["params"]
    import transformers

    module = hf_families.build_model(model, index)
    shapes = {name: list(p.shape) for name, p in module.named_parameters()}
    emap = hf_families.element_map(model, index)
    hf_families.check_bijection(emap, shapes, index)
    runs = hf_families.recorded(emap, index)
    return {
        "preset": preset,
        "class": hf_families.class_name(model),
        "transformers": transformers.__version__,
        "model": model,
        "layout": [{"name": p["name"], "shape": p["shape"]} for p in index],
        "hf": [{"name": name, "shape": shape, "runs": runs[name]} for name, shape in shapes.items()],
        "absent": emap.absent,
        "why_absent": emap.why,
        "elements": {"tally": layout["total_elements"], "hf": sum(p.numel() for p in module.parameters())},
    }


def main(argv):
    tally = argv[1] if len(argv) > 1 else "build/cli/tally"
    out = pathlib.Path(__file__).resolve().parent / "fixtures"
    for preset in hf_families.FAMILIES:
        path = out / f"hf-{preset}.json"
        path.write_text(json.dumps(record(tally, preset), indent=1) + "\n")
        print(path)


if __name__ == "__main__":
    main(sys.argv)
