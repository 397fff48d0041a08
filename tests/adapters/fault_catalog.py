"""The fault catalog the workers' plant tables answer to, read from the tally binary the tests were
built with (`tally run --list-faults --json`, the C++ catalog itself), so a fault renamed or added
in C++ fails the tables' tests by name."""

import json
import os
import subprocess


def catalog_names(test):
    """The catalog's fault names; skips `test` where no tally binary is named (TALLY)."""
    tally = os.environ.get("TALLY")
    if not tally:
        test.skipTest("TALLY names no tally binary: the catalog is read from `tally run --list-faults --json`")
    out = subprocess.run([tally, "run", "--list-faults", "--json"], check=True, capture_output=True, text=True)
    return {fault["name"] for fault in json.loads(out.stdout)["faults"]}


def assert_plants_answer_the_catalog(test, plants, not_planted):
    """Every catalog fault is planted or has a reason, no fault is both, and no table names a
    fault the catalog lacks."""
    catalog = catalog_names(test)
    test.assertFalse(set(plants) & set(not_planted), "planted and not planted at once")
    test.assertEqual(sorted(set(plants) - catalog) + sorted(set(not_planted) - catalog), [],
                     "names the catalog does not have (renamed in C++?)")
    test.assertEqual(sorted(catalog - set(plants) - set(not_planted)), [],
                     "catalog faults the worker neither plants nor gives a reason for")
    for name, reason in list(plants.items()) + list(not_planted.items()):
        test.assertTrue(reason, f"{name}: an empty entry")
