"""A module of a user's own that fails as it is imported (loaded by ``module_path`` in tests)."""

raise RuntimeError("a bug at import time")
