"""The planted-bug audit (``tests/audit/planted_bugs.py``) still applies to the code: each
snippet is found exactly once, and each selection names a test file that exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.audit.planted_bugs import BUGS, ROOT, Bug, apply


def test_bug_ids_are_unique():
    ids = [bug.id for bug in BUGS]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("bug", BUGS, ids=lambda bug: bug.id)
def test_each_planted_bug_still_applies(bug: Bug, tmp_path: Path):
    copy = tmp_path / bug.file
    copy.parent.mkdir(parents=True)
    copy.write_text((ROOT / bug.file).read_text())
    apply(bug, tmp_path)
    assert copy.read_text() != (ROOT / bug.file).read_text()
    for selection in bug.tests:
        path, _, name = selection.partition("::")
        assert (ROOT / path).is_file(), selection
        if name:
            assert f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), selection
