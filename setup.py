"""The one compiled part: the fs tier's per-file I/O (``src/kvtier/tiers/fs/_fastio.c``).

Linux only (it needs ``openat2``). It is optional: where it cannot be built (no compiler, no
Python headers) kvtier installs without it and the fs tier takes its pure-Python path, which
``kvtier.tiers.fs.native.AVAILABLE`` reports. Everything else is in ``pyproject.toml``.
"""

import sys

from setuptools import Extension, setup

FASTIO = Extension(
    "kvtier.tiers.fs._fastio",
    sources=["src/kvtier/tiers/fs/_fastio.c"],
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    optional=True,
)

setup(ext_modules=[FASTIO] if sys.platform.startswith("linux") else [])
