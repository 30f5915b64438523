"""The guide's support table is the architecture matrix's, row for row, README's table names exactly its families,
and every recurrent model type accepted as rollback-tested is a row of that matrix."""

from __future__ import annotations

import re

from helpers.architecture_matrix import FAMILIES, supported_targets_table
from helpers.paths import ROOT

from dspark_lightning.models.architectures import ROLLBACK_TESTED

GUIDE = ROOT / "docs/guides/supported_targets.md"
START, END = "<!-- matrix table:", "<!-- end of matrix table -->"


def test_the_guide_table_equals_the_matrix():
    lines = GUIDE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(START))
    table = lines[start + 1 : lines.index(END)]
    expected = supported_targets_table()
    assert table == expected, "docs/guides/supported_targets.md's table should read:\n" + "\n".join(expected)


def test_every_rollback_tested_type_is_in_the_matrix():
    assert set(ROLLBACK_TESTED) <= {family.name for family in FAMILIES}


def test_the_readme_table_names_every_family_of_the_matrix_once():
    section = (ROOT / "README.md").read_text().split("\n## Targets\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    named = [name for row in rows for name in re.findall(r"`([^`]+)`", row.split("|")[1])]
    assert sorted(named) == sorted(family.name for family in FAMILIES) and len(named) == len(set(named))
    assert all(row.rstrip().endswith("| passes |") for row in rows)
