"""Running the ``kvtier`` command line in-process, as the CLI tests do."""

from __future__ import annotations

import pytest

from kvtier.cli.main import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``main(argv)``: its exit status, stdout and stderr (``SystemExit`` becomes a status)."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
