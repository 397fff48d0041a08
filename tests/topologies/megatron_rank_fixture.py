#!/usr/bin/env python3
"""Generates tests/topologies/data/megatron_rank_groups.{txt,json} from Megatron-LM's own code,
or, from a megatron-core with generalized TP (0.19 and later), megatron_0_19_rank_groups.{txt,json}.

Run (Python 3.8+, no torch needed):

    python3 tests/topologies/megatron_rank_fixture.py /path/to/megatron/core/parallel_state.py

To see Megatron's canonical text (or rejection) for one configuration, e.g. after a mismatch:

    python3 tests/topologies/megatron_rank_fixture.py PATH/parallel_state.py \
      --show WORLD TP CP PP EP ETP ORDER

Get parallel_state.py from the megatron-core wheel:

    cd /tmp/mcore && pip download --no-deps megatron-core==0.16.1 -d . \
      && unzip -o megatron_core-*.whl megatron/core/parallel_state.py megatron/core/package_info.py

The committed fixtures were produced from megatron-core 0.16.1 (parallel_state.py sha256
c94fa8ea456eae4f3c7f710b3d3c78b9e8d1ba485ab9d787333428bdbd51d269) and 0.19.2 (see the header of
megatron_0_19_rank_groups.txt).

With generalized TP (a RankGenerator that takes gtp_remat) the script mirrors 0.19's
initialize_model_parallel instead: gtp_remat injected by Megatron's own _inject_gtp_remat_axis
(after tp in the dense order, after ep in the expert one), the model-parallel, tp-dp-cp and tp-dp
groups spanning it, the GTP groups, and the distributed-optimizer group the whole world when GTP
or EGTP > 1. Its lines carry two more sizes, `world tp cp pp ep etp gtp egtp codes digest...`,
and cover the configurations with GTP or EGTP > 1 (gtp = egtp = 1 is 0.16.1's layout, which the
first fixture covers; a sample of them is kept to show 0.19 did not change it).

Importing parallel_state needs torch, so this script parses the file with `ast`, execs only
generate_masked_orthogonal_rank_groups, RankGenerator and default_embedding_ranks (plus the
`typing` imports their annotations use), and calls them for every group. The acceptance rules of
initialize_model_parallel live inside that torch-bound function, so they are mirrored here
statement by statement (see layout()); RankGenerator's own check for an axis missing from the
order is Megatron's code, called as is.

Output (see --out-dir):
  megatron_rank_groups.txt   the coverage, then one line per size tuple that Megatron accepts
                             under at least one order (a tuple with no line is rejected under
                             every order):
                               world tp cp pp ep etp codes digest0 digest1 ...
                             codes has one character per order of the world's `orders` line:
                             '.' = rejected, else the index (0-9a-zA-Z) of the digest on this
                             line. A digest is the 64-bit FNV-1a (16 hex digits) of the canonical
                               family:[[r,r],[r]];family:[[...]]...
                             over the `families` line, in that order, no spaces; a family lists
                             its groups in Megatron's creation order, each group's ranks as
                             listed. (One line per configuration would be 40 MB: most of the
                             1.3 M configurations fail divisibility, and many orders of a tuple
                             give the same groups.)
  megatron_rank_groups.json  full group lists for a small readable subset (READABLE).
"""

import argparse
import ast
import hashlib
import itertools
import json
import os
import re
import sys

# Families in digest order: the dense generator, the expert generator, then the derived ones.
DENSE = ["tp", "cp", "dp", "dp-cp", "pp", "tp-pp", "tp-cp", "tp-dp-cp", "tp-dp"]
EXPERT = [("expt-tp", "tp"), ("expt-ep", "ep"), ("expt-dp", "dp"), ("expt-tp-ep", "tp-ep"),
          ("expt-tp-ep-pp", "tp-ep-pp")]
FAMILIES = DENSE + [name for name, _ in EXPERT] + ["embedding", "dist-opt"]

# megatron-core 0.19: the tokens of the families that span gtp_remat, and the new families.
DENSE_019 = {"tp-pp": "tp-gtp_remat-pp", "tp-dp-cp": "tp-gtp_remat-dp-cp", "tp-dp": "tp-gtp_remat-dp"}
GTP_DENSE = [("gtp", "gtp_remat"), ("gtp-dp", "gtp_remat-dp"), ("gtp-dp-cp", "gtp_remat-dp-cp")]
GTP_EXPERT = [("expt-gtp", "gtp_remat"), ("expt-gtp-dp", "gtp_remat-dp"),
              ("expt-tp-ep-gtp-pp", "tp-ep-gtp_remat-pp")]
FAMILIES_019 = FAMILIES + [name for name, _ in GTP_DENSE + GTP_EXPERT]
GTP_SIZES = [1, 2, 3, 4]
WORLDS_019 = list(range(1, 13)) + [16]


def orders_019(world):
    """orders_for() without the orders that omit tp: 0.19.2's RankGenerator tests `name not in
    order` on the string, finds "tp" inside "gtp_remat" and never appends tp, so get_ranks raises
    ValueError for any such order (0.16.1 accepts them with tp = 1; tally follows 0.16.1)."""
    return [o for o in orders_for(world) if "tp" in o.split("-")]

TOKENS = ["tp", "cp", "ep", "dp", "pp"]
# Every permutation for small worlds; a fixed sample (plus partial orders, which Megatron accepts
# when the omitted axes have size 1) for large ones. Partial orders are checked everywhere.
SMALL_WORLD_MAX = 8
FIXED_ORDERS = [
    "tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp", "pp-dp-ep-cp-tp", "ep-tp-dp-cp-pp", "dp-tp-cp-ep-pp",
    "cp-tp-ep-dp-pp", "tp-ep-cp-pp-dp", "pp-tp-cp-ep-dp", "tp-dp-ep-cp-pp", "ep-dp-pp-tp-cp",
    "tp-pp-cp-ep-dp", "dp-pp-tp-ep-cp",
]
PARTIAL_ORDERS = ["tp-dp-pp", "tp-pp-dp", "tp-dp", "tp-ep-dp-pp", "tp-cp-dp-pp", "dp-tp", "pp"]
WORLDS = list(range(1, 17)) + [24, 32]

# Readable subset: (world, tp, cp, pp, ep, etp, order). A, B, C are the worked examples of
# docs/megatron-reference.md §4; the rest exercise cp, etp != tp and odd orders.
READABLE = [
    (8, 2, 1, 1, 4, 1, "tp-cp-ep-dp-pp"),  # A
    (8, 2, 1, 1, 2, 1, "tp-cp-ep-dp-pp"),  # B
    (8, 2, 1, 2, 2, 1, "tp-cp-ep-dp-pp"),  # C
    (8, 2, 1, 1, 2, 1, "tp-cp-ep-pp-dp"),  # B under the pp-before-dp order
    (16, 2, 2, 2, 2, 1, "tp-cp-ep-dp-pp"),
    (16, 1, 2, 2, 4, 2, "tp-cp-ep-dp-pp"),
    (12, 2, 1, 3, 1, 2, "pp-dp-ep-cp-tp"),
    (8, 2, 2, 2, 1, 2, "tp-pp-dp"),        # partial order, rejected (cp omitted but cp = 2)
    (8, 2, 1, 2, 1, 2, "tp-pp-dp"),        # partial order, accepted
    (6, 3, 1, 2, 1, 1, "ep-tp-dp-cp-pp"),
    (8, 2, 1, 2, 2, 1, "tp-pp-cp-ep-dp"),  # rejected: pp groups differ
    (8, 2, 1, 2, 1, 1, "tp-cp-ep-pp-dp"),  # rejected: edp != dp with pp not last
    (12, 2, 1, 1, 1, 2, "tp-dp"),          # partial order, accepted
    (12, 3, 1, 2, 2, 1, "tp-dp-pp"),       # rejected: ep = 2 omitted from the order
]


def load_megatron(path):
    """Execs the pure rank-layout definitions of parallel_state.py in a fresh namespace."""
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    wanted = {"generate_masked_orthogonal_rank_groups", "RankGenerator", "default_embedding_ranks"}
    optional = {"_inject_gtp_remat_axis"}  # megatron-core 0.19 and later
    body = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in optional:
            body.append(node)
            continue
        if isinstance(node, ast.ImportFrom) and node.module == "typing":
            body.append(node)  # annotations such as List[int] are evaluated at def time
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in wanted:
            body.append(node)
            wanted.discard(node.name)
    if wanted:
        sys.exit(f"{path}: definitions not found: {sorted(wanted)}")
    namespace = {"__name__": "megatron_parallel_state_subset"}
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), namespace)
    return namespace


def megatron_version(path):
    info = os.path.join(os.path.dirname(path), "package_info.py")
    if not os.path.exists(info):
        return "unknown"
    text = open(info).read()
    parts = [re.search(rf"^{k} = (\S+)", text, re.M) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(p.group(1) for p in parts) if all(parts) else "unknown"


def has_gtp(mg):
    return "_inject_gtp_remat_axis" in mg


def layout_019(mg, world, tp, cp, pp, ep, etp, gtp, egtp, order):
    """layout() for megatron-core 0.19.2's initialize_model_parallel (parallel_state.py lines
    806-900, the groups at 939-1423 and the dist-opt group at 1544-1573), with
    num_distributed_optimizer_instances=1 and no virtual pipeline."""
    RankGenerator = mg["RankGenerator"]
    inject = mg["_inject_gtp_remat_axis"]
    model_size = tp * pp * cp * gtp
    if world % model_size != 0:  # 821: RuntimeError
        return None, "world not divisible by tp*pp*cp*gtp"
    dp = world // model_size
    try:
        dense = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=inject(order, after="tp"),
                              rank_offset=0, gtp_remat=gtp)
    except RuntimeError as error:
        return None, f"dense RankGenerator: {error}"
    expert_model = etp * ep * pp * egtp
    edp = world // expert_model
    if world % expert_model != 0:
        return None, "world not divisible by etp*ep*pp*egtp"
    try:
        expert = RankGenerator(tp=etp, ep=ep, dp=edp, pp=pp, cp=1, order=inject(order, after="ep"),
                               rank_offset=0, gtp_remat=egtp)
    except RuntimeError as error:
        return None, f"expert RankGenerator: {error}"
    if not (order.endswith("pp") or pp == 1 or edp == dp):
        return None, "order does not end in pp, pp > 1 and edp != dp"
    if dense.get_ranks("pp") != expert.get_ranks("pp"):
        return None, "pp groups differ between the dense and the expert generator"

    groups = {name: dense.get_ranks(DENSE_019.get(name, name)) for name in DENSE}
    for name, token in EXPERT:
        groups[name] = expert.get_ranks(token)
    groups["embedding"] = [mg["default_embedding_ranks"](r) for r in dense.get_ranks("pp")]
    # 1544 (GTP or EGTP > 1) and 1560 with one instance agree: every tp-ep-pp group, sorted.
    groups["dist-opt"] = [sorted(r for ranks in expert.get_ranks("tp-ep-pp") for r in ranks)]
    for name, token in GTP_DENSE:
        groups[name] = dense.get_ranks(token)
    for name, token in GTP_EXPERT:
        groups[name] = expert.get_ranks(token)
    return groups, None


def layout(mg, world, tp, cp, pp, ep, etp, order):
    """(groups, None) with Megatron's groups for one configuration, or (None, reason) when
    initialize_model_parallel rejects it.

    Mirrors parallel_state.py (0.16.1) initialize_model_parallel, lines 738-817, with
    virtual_pipeline_model_parallel_size=None and num_distributed_optimizer_instances=1 (whose
    divisibility asserts at 833 and 1263 then always hold), and the dist-opt loop at 1334-1348.
    """
    RankGenerator = mg["RankGenerator"]
    model_size = tp * pp * cp
    if world % model_size != 0:  # 740: RuntimeError
        return None, "world not divisible by tp*pp*cp"
    dp = world // model_size
    try:  # 775: raises RuntimeError for an axis of size > 1 missing from the order
        dense = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order, rank_offset=0)
    except RuntimeError as error:
        return None, f"dense RankGenerator: {error}"
    expert_model = etp * ep * pp
    edp = world // expert_model
    if world % expert_model != 0:  # 792: RuntimeError
        return None, "world not divisible by etp*ep*pp"
    try:  # 798
        expert = RankGenerator(tp=etp, ep=ep, dp=edp, pp=pp, cp=1, order=order, rank_offset=0)
    except RuntimeError as error:
        return None, f"expert RankGenerator: {error}"
    if not (order.endswith("pp") or pp == 1 or edp == dp):  # 808: assert
        return None, "order does not end in pp, pp > 1 and edp != dp"
    if dense.get_ranks("pp") != expert.get_ranks("pp"):  # 814: assert
        return None, "pp groups differ between the dense and the expert generator"

    groups = {name: dense.get_ranks(name) for name in DENSE}
    for name, token in EXPERT:
        groups[name] = expert.get_ranks(token)
    groups["embedding"] = [mg["default_embedding_ranks"](r) for r in dense.get_ranks("pp")]
    # 1334-1348 with k = 1: every tp-ep-pp group into one instance; new_group sorts ranks.
    per_instance = edp  # intra_partial_expert_data_parallel_size = edp // k
    instances, current = [], []
    for i, ranks in enumerate(expert.get_ranks("tp-ep-pp"), start=1):
        current.extend(ranks)
        if i % per_instance == 0:
            instances.append(sorted(current))
            current = []
    groups["dist-opt"] = instances
    return groups, None


def canonical(groups, families=FAMILIES):
    return ";".join(f"{name}:{json.dumps(groups[name], separators=(',', ':'))}" for name in families)


def fnv1a64(text):
    h = 0xCBF29CE484222325
    for byte in text.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def orders_for(world):
    full = ["-".join(p) for p in itertools.permutations(TOKENS)] if world <= SMALL_WORLD_MAX else FIXED_ORDERS
    return full + PARTIAL_ORDERS


def write_019(mg, args, version, sha):
    """megatron_0_19_rank_groups.{txt,json}: the configurations with GTP or EGTP > 1, and those
    without for worlds up to 8 (0.16.1's layout, unchanged)."""
    header = [
        "# Megatron-LM rank groups with generalized TP, generated by tests/topologies/megatron_rank_fixture.py",
        f"# from megatron-core {version} parallel_state.py (sha256 {sha}).",
        "# Format: see the docstring of megatron_rank_fixture.py; lines are world tp cp pp ep etp gtp egtp.",
        "families " + " ".join(FAMILIES_019),
        "worlds " + " ".join(map(str, WORLDS_019)),
        f"orders 1 {SMALL_WORLD_MAX} " + " ".join(orders_019(1)),
        f"orders {SMALL_WORLD_MAX + 1} {max(WORLDS_019)} " + " ".join(orders_019(max(WORLDS_019))),
        "gtp_sizes " + " ".join(map(str, GTP_SIZES)),
    ]
    digits = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    lines, accepted, rejected = [], 0, 0
    for world in WORLDS_019:
        ds = divisors(world)
        gs = [g for g in GTP_SIZES if world % g == 0]
        for tp, cp, pp, ep, etp, gtp, egtp in itertools.product(ds, ds, ds, ds, ds, gs, gs):
            if gtp == 1 and egtp == 1 and world > SMALL_WORLD_MAX:
                continue
            if world % (tp * cp * pp * gtp) or world % (etp * ep * pp * egtp):
                continue  # rejected under every order: not listed, not counted
            codes, digests = [], []
            for order in orders_019(world):
                groups, _ = layout_019(mg, world, tp, cp, pp, ep, etp, gtp, egtp, order)
                if groups is None:
                    rejected += 1
                    codes.append(".")
                    continue
                accepted += 1
                digest = fnv1a64(canonical(groups, FAMILIES_019))
                if digest not in digests:
                    assert len(digests) < len(digits), "too many layouts for one size tuple"
                    digests.append(digest)
                codes.append(digits[digests.index(digest)])
            if digests:
                lines.append(f"{world} {tp} {cp} {pp} {ep} {etp} {gtp} {egtp} {''.join(codes)} {' '.join(digests)}")
    header.append(f"totals {accepted} {rejected}")
    readable = []
    for world, tp, cp, pp, ep, etp, gtp, egtp, order in READABLE_019:
        groups, reason = layout_019(mg, world, tp, cp, pp, ep, etp, gtp, egtp, order)
        entry = {"world": world, "tp": tp, "cp": cp, "pp": pp, "ep": ep, "etp": etp, "gtp": gtp,
                 "egtp": egtp, "order": order, "accepted": groups is not None}
        if reason:
            entry["rejected_by"] = reason
        if groups is not None:
            entry["groups"] = {name: groups[name] for name in FAMILIES_019}
            entry["digest"] = fnv1a64(canonical(groups, FAMILIES_019))
        readable.append(entry)
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "megatron_0_19_rank_groups.txt"), "w") as f:
        f.write("\n".join(header + lines) + "\n")
    with open(os.path.join(args.out_dir, "megatron_0_19_rank_groups.json"), "w") as f:
        json.dump({"generator": "tests/topologies/megatron_rank_fixture.py",
                   "megatron_core": version, "parallel_state_sha256": sha,
                   "families": FAMILIES_019, "configs": readable}, f, indent=1)
        f.write("\n")
    print(f"{accepted} accepted, {rejected} rejected", file=sys.stderr)


# Readable subset with generalized TP: (world, tp, cp, pp, ep, etp, gtp, egtp, order).
READABLE_019 = [
    (4, 1, 1, 1, 1, 1, 2, 2, "tp-cp-ep-dp-pp"),
    (8, 2, 1, 1, 2, 1, 2, 1, "tp-cp-ep-dp-pp"),
    (8, 1, 1, 2, 2, 1, 1, 2, "tp-cp-ep-dp-pp"),
    (8, 2, 2, 1, 1, 2, 2, 2, "tp-dp-ep-cp-pp"),  # EP 1, ETP = TP, EGTP = GTP; the GTP groups differ
    (8, 1, 1, 1, 1, 1, 1, 2, "tp-cp-ep-dp-pp"),  # EP 1, ETP = TP, EGTP != GTP (#6080)
    (12, 1, 1, 2, 1, 1, 3, 2, "tp-cp-ep-dp-pp"),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("parallel_state", help="path to megatron/core/parallel_state.py")
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"))
    parser.add_argument("--version", help="megatron-core version to record (default: package_info.py)")
    parser.add_argument("--show", nargs="+", metavar="SIZE",
                        help="WORLD TP CP PP EP ETP [GTP EGTP] ORDER: print one configuration's "
                             "canonical text and digest, write nothing")
    args = parser.parse_args()

    mg = load_megatron(args.parallel_state)
    if args.show:
        sizes, order = list(map(int, args.show[:-1])), args.show[-1]
        if len(sizes) == 8:
            if not has_gtp(mg):
                sys.exit("--show with GTP sizes needs a megatron-core with generalized TP (0.19+)")
            groups, reason = layout_019(mg, *sizes, order)
            families = FAMILIES_019
        elif len(sizes) == 6:
            groups, reason = layout(mg, *sizes, order)
            families = FAMILIES
        else:
            sys.exit("--show takes WORLD TP CP PP EP ETP [GTP EGTP] ORDER")
        print(f"rejected: {reason}" if groups is None else f"{fnv1a64(canonical(groups, families))} {canonical(groups, families)}")
        return
    version = args.version or megatron_version(args.parallel_state)
    sha = hashlib.sha256(open(args.parallel_state, "rb").read()).hexdigest()
    if has_gtp(mg):
        write_019(mg, args, version, sha)
        return
    header = [
        "# Megatron-LM rank groups, generated by tests/topologies/megatron_rank_fixture.py",
        f"# from megatron-core {version} parallel_state.py (sha256 {sha}).",
        "# Format: see the docstring of megatron_rank_fixture.py; `totals` = accepted rejected.",
        "families " + " ".join(FAMILIES),
        "worlds " + " ".join(map(str, WORLDS)),
        f"orders 1 {SMALL_WORLD_MAX} " + " ".join(orders_for(1)),
        f"orders {SMALL_WORLD_MAX + 1} {max(WORLDS)} " + " ".join(orders_for(max(WORLDS))),
    ]

    digits = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    lines, accepted, rejected = [], 0, 0
    for world in WORLDS:
        ds = divisors(world)
        for tp, cp, pp, ep, etp in itertools.product(ds, repeat=5):
            codes, digests = [], []
            for order in orders_for(world):
                groups, _ = layout(mg, world, tp, cp, pp, ep, etp, order)
                if groups is None:
                    rejected += 1
                    codes.append(".")
                    continue
                accepted += 1
                digest = fnv1a64(canonical(groups))
                if digest not in digests:
                    assert len(digests) < len(digits), "too many layouts for one size tuple"
                    digests.append(digest)
                codes.append(digits[digests.index(digest)])
            if digests:
                lines.append(f"{world} {tp} {cp} {pp} {ep} {etp} {''.join(codes)} {' '.join(digests)}")
    header.append(f"totals {accepted} {rejected}")  # configurations accepted, rejected

    readable = []
    for world, tp, cp, pp, ep, etp, order in READABLE:
        groups, reason = layout(mg, world, tp, cp, pp, ep, etp, order)
        entry = {"world": world, "tp": tp, "cp": cp, "pp": pp, "ep": ep, "etp": etp,
                 "order": order, "accepted": groups is not None}
        if reason:
            entry["rejected_by"] = reason
        if groups is not None:
            entry["groups"] = {name: groups[name] for name in FAMILIES}
            entry["digest"] = fnv1a64(canonical(groups))
        readable.append(entry)

    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "megatron_rank_groups.txt"), "w") as f:
        f.write("\n".join(header + lines) + "\n")
    with open(os.path.join(args.out_dir, "megatron_rank_groups.json"), "w") as f:
        json.dump({"generator": "tests/topologies/megatron_rank_fixture.py",
                   "megatron_core": version, "parallel_state_sha256": sha,
                   "families": FAMILIES, "configs": readable}, f, indent=1)
        f.write("\n")
    print(f"{accepted} accepted, {rejected} rejected", file=sys.stderr)


if __name__ == "__main__":
    main()
