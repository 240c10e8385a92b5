"""The compiled parts: the fs tier's per-file I/O (``src/kvtier/tiers/fs/_fastio.c``) and the
payload checksum (``src/kvtier/tiers/shared/_checksum.c``), both around ``xxh3.h``.

Linux only (it needs ``openat2``). It is optional: where it cannot be built (no compiler, no
Python headers) kvtier installs without it and the fs tier takes its pure-Python path, which
``kvtier.tiers.fs.native.AVAILABLE`` reports. Everything else is in ``pyproject.toml``.
"""

import sys

from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"]
XXH3 = "src/kvtier/tiers/shared/xxh3.h"
FASTIO = Extension(
    "kvtier.tiers.fs._fastio",
    sources=["src/kvtier/tiers/fs/_fastio.c"],
    depends=[XXH3],
    extra_compile_args=FLAGS,
    optional=True,
)
CHECKSUM = Extension(
    "kvtier.tiers.shared._checksum",
    sources=["src/kvtier/tiers/shared/_checksum.c"],
    depends=[XXH3],
    extra_compile_args=FLAGS,
    optional=True,
)

setup(ext_modules=[FASTIO, CHECKSUM] if sys.platform.startswith("linux") else [])
