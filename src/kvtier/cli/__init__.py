"""The ``kvtier`` command line (``main``); each command's options live beside its feature."""

from kvtier.cli.main import main

__all__ = ["main"]
