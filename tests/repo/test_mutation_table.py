"""The mutation audit stays runnable: every mutation's old text still occurs exactly once in the code it mutates
(a refactor that moves the text fails here, not silently in the next audit), and every mutation in the table has
a recorded row in ``experiments/mutation_audit/results.json`` (a new one must be run, ``--only ID --merge``)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

from helpers.paths import ROOT


def test_every_mutation_still_applies_to_the_code():
    checked = subprocess.run([sys.executable, "scripts/mutation_audit.py", "--check"], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
    assert checked.returncode == 0, checked.stderr + checked.stdout
    assert "every old text found exactly once" in checked.stdout


def test_every_mutation_in_the_table_has_a_recorded_result():
    spec = importlib.util.spec_from_file_location("mutations", ROOT / "scripts/mutations.py")
    table = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = table  # its dataclasses resolve their string annotations through sys.modules
    spec.loader.exec_module(table)
    MUTATIONS = table.MUTATIONS
    recorded = {
        r["id"]: r for r in json.loads((ROOT / "experiments/mutation_audit/results.json").read_text())["results"]
    }
    assert [m.id for m in MUTATIONS if m.id not in recorded] == []
    for m in MUTATIONS:  # the row was recorded for this mutation's text, not an older one
        assert (recorded[m.id]["old"], recorded[m.id]["new"]) == (m.old, m.new), m.id
