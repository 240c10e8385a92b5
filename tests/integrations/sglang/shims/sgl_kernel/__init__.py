"""TEST-ONLY stand-in for ``sgl_kernel`` (no CPU build on PyPI); see ../README.md.

Every attribute, of this package or of any ``sgl_kernel.<sub>`` module, resolves to a
``_Unavailable`` placeholder: importing works, calling raises ``NotImplementedError``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

__version__ = "0.0.0+kvtier-test-shim"


class _Unavailable:
    """A kernel this machine does not have; attributes are placeholders too."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"kvtier test shim: sgl_kernel {self._name} is not available")

    def __repr__(self) -> str:
        return f"<unavailable sgl_kernel {self._name}>"


def _module_getattr(module_name: str) -> Any:
    def resolve(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(f"{module_name}.{name}")

    return resolve


__getattr__ = _module_getattr("sgl_kernel")


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any ``sgl_kernel.x.y`` imports as an empty package of placeholders."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not fullname.startswith("sgl_kernel."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr(spec.name)  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


sys.meta_path.insert(0, _Submodules())
