"""The HTML index of one night of ci/nightly-real: for each target and world (a folder
TARGET-worldW under the night's folder), the sweep's counts from its state file and the campaign's
from its JSON, each new failure and infrastructure error with a link to its report or case file,
and every case where tally's model of the release disagrees with the release.

    python3 ci/nightly_real_index.py NIGHT_FOLDER      (writes NIGHT_FOLDER/index.html)
"""

import html
import json
import os
import sys


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_rc(path):
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def link(night, path, text):
    """A link to `path` relative to the night's folder, or the text alone where there is no file."""
    if path and os.path.exists(path):
        return f'<a href="{html.escape(os.path.relpath(path, night))}">{html.escape(text)}</a>'
    return html.escape(text)


def in_part(part, folder, path):
    """`path` as recorded, or, where the night's folder was moved since (the paths in a state or report
    are where the run wrote them), the file of that name in the part's `folder`."""
    if not path or os.path.exists(path):
        return path
    moved = os.path.join(part, folder, os.path.basename(path))
    return moved if os.path.exists(moved) else path


def sweep_row(night, part):
    state = read_json(os.path.join(part, "sweep", "sweep-state.json"))
    rc = read_rc(os.path.join(part, "sweep.rc"))
    if state is None:
        log = os.path.join(part, "sweep.log")
        if rc is None and not os.path.exists(log):
            return {"cells": ["not run"], "new": [], "model": [], "refused": []}
        status = f"exit {rc}" if rc is not None else "no exit status"
        return {"cells": [f"no state ({status}); " + link(night, log, "its log")], "new": [], "model": [], "refused": []}
    results = state["results"]

    def count(outcome):
        return sum(1 for r in results if r["outcome"] == outcome)

    new = [r for r in results if (r["outcome"] == "fail" and "known" not in r) or r["outcome"] == "infra-error"]
    by_framework = [r for r in results if r["outcome"] == "refused" and r.get("by_framework")]
    known = sum(1 for r in results if r["outcome"] == "fail" and "known" in r)
    checked = sum(1 for r in results if r.get("model_checked"))
    model = [r for r in results if r.get("model_disagrees")]
    done = f"{len(results)} of {state['total_cases']}"
    cells = [
        f"{state['configurations']} configurations, {state['layouts']} layouts, {done} cases",
        f"{count('pass')} passed, {len(new)} new, {known} known, {count('refused')} refused"
        + (f" ({len(by_framework)} by the framework itself)" if by_framework else ""),
        (f"held against {checked}, disagrees on {len(model)}" if checked else "no model of this release"),
        link(night, os.path.join(part, "sweep-html", "index.html"), "sweep report")
        + f" (exit {rc})",
    ]
    rows = []
    for r in new:
        page = os.path.join(part, "sweep-html", r["id"] + ".html")
        rows.append((r["id"], r["outcome"], r.get("detail", ""), link(night, page, "report")
                     + ("; " + link(night, in_part(part, "sweep", r["case_file"]), "case file")
                        if r.get("case_file") else "")))
    refused = {}
    for r in by_framework:
        refused[r.get("detail", "")] = refused.get(r.get("detail", ""), 0) + 1
    return {"cells": cells, "new": rows, "model": [(r["id"], r["model_disagrees"]) for r in model],
            "refused": sorted(refused.items(), key=lambda item: -item[1])}


def campaign_row(night, part):
    report = read_json(os.path.join(part, "fuzz.json"))
    rc = read_rc(os.path.join(part, "fuzz.rc"))
    if rc is None:
        return {"cells": ["not run"], "new": [], "refused": []}
    if report is None:
        return {"cells": [f"no report (exit {rc}); " + link(night, os.path.join(part, "fuzz.log"), "its log")],
                "new": [], "refused": []}
    cells = [f"{report['cases']} cases in {report['seconds']:.0f} s, seed {report['seed']}",
             f"new {report['new']}, known {report['known']}, refused {report.get('refused', 0)}, "
             f"stopped by {report['stopped_by']} (exit {rc})"
             + (f"; {report['nothing_checked']}" if report.get("nothing_checked") else "")]
    rows = []
    for f in report["failures"]:
        if f.get("known"):
            continue
        case = in_part(part, "fuzz", f.get("shrunk") or f.get("original", ""))
        rows.append((f"case {f['case']}", "fail", f.get("failure", ""), link(night, case, "case file")
                     + html.escape(f"; tally replay {os.path.abspath(case)}" if case else "")))
    if report.get("infra_error"):
        e = report["infra_error"]
        rows.append((f"case {e['case']}", "infra-error", e.get("message", "").split("\n")[0],
                     link(night, in_part(part, "fuzz", e.get("saved", "")), "case file")))
    refused = sorted(report.get("refused_by_reason", {}).items(), key=lambda item: -item[1])
    return {"cells": cells, "new": rows, "refused": refused}


def main(argv):
    if len(argv) != 2 or not os.path.isdir(argv[1]):
        print("usage: nightly_real_index.py NIGHT_FOLDER (a folder ci/nightly-real wrote)", file=sys.stderr)
        return 2
    night = argv[1]
    parts = sorted(d for d in os.listdir(night) if os.path.isdir(os.path.join(night, d)) and "-world" in d)
    out = ["<!doctype html><html><head><meta charset=\"utf-8\"><title>tally nightly-real: "
           + html.escape(os.path.basename(os.path.abspath(night))) + "</title><style>"
           "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:1.5em}"
           "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}"
           ".new{background:#fdd}.model{background:#ffe6cc}</style></head><body>",
           "<h1>tally nightly-real: " + html.escape(os.path.basename(os.path.abspath(night))) + "</h1>"]
    if not parts:
        out.append("<p>No target ran this night (no TARGET-worldW folder).</p>")
    out.append("<table><tr><th>target, world</th><th>sweep</th><th>outcomes</th><th>tally's model</th>"
               "<th>report</th><th>campaign</th><th>outcomes</th></tr>")
    new_rows, model_rows, refused_rows = [], [], []
    for name in parts:
        part = os.path.join(night, name)
        sweep, campaign = sweep_row(night, part), campaign_row(night, part)
        cells = sweep["cells"] + [""] * (4 - len(sweep["cells"])) + campaign["cells"] + [""] * (2 - len(campaign["cells"]))
        out.append("<tr><td>" + html.escape(name) + "</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        new_rows += [(name, "sweep") + r for r in sweep["new"]] + [(name, "campaign") + r for r in campaign["new"]]
        model_rows += [(name,) + r for r in sweep["model"]]
        refused_rows += [(name, "sweep") + r for r in sweep["refused"]] + [(name, "campaign") + r for r in campaign["refused"]]
    out.append("</table>")
    out.append(f"<h2>New: {len(new_rows)}</h2>")
    if new_rows:
        out.append("<table><tr><th>part</th><th>by</th><th>case</th><th>outcome</th><th>what</th><th>evidence</th></tr>")
        for part, by, case, outcome, what, evidence in new_rows:
            out.append(f"<tr class=\"new\"><td>{html.escape(part)}</td><td>{by}</td><td>{html.escape(case)}</td>"
                       f"<td>{html.escape(outcome)}</td><td>{html.escape(what)}</td><td>{evidence}</td></tr>")
        out.append("</table>")
    # A refusal of the framework's own hides what its cases would show, until a rule cites its check.
    out.append(f"<h2>Refused by the framework itself: {sum(n for _, _, _, n in refused_rows)}</h2>")
    if refused_rows:
        out.append("<table><tr><th>part</th><th>by</th><th>cases</th><th>the framework's reason</th></tr>")
        for part, by, why, n in refused_rows:
            out.append(f"<tr class=\"new\"><td>{html.escape(part)}</td><td>{by}</td><td>{n}</td><td>{html.escape(why)}</td></tr>")
        out.append("</table>")
    out.append(f"<h2>tally's model and the release disagree: {len(model_rows)}</h2>")
    if model_rows:
        out.append("<table><tr><th>part</th><th>case</th><th>what each gave</th></tr>")
        for part, case, what in model_rows:
            out.append(f"<tr class=\"model\"><td>{html.escape(part)}</td><td>{html.escape(case)}</td>"
                       f"<td>{html.escape(what)}</td></tr>")
        out.append("</table>")
    out.append("</body></html>\n")
    with open(os.path.join(night, "index.html"), "w") as f:
        f.write("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
