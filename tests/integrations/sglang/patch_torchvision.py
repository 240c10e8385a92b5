"""Make PyPI's (CUDA) torchvision importable on CPU torch, for the SGLang test venv only.

``python patch_torchvision.py`` in that venv. SGLang imports torchvision; PyPI's wheel is a
CUDA build whose C extension will not load against the CPU torch and whose fake-op
registrations then fail at import. This removes the C extension (so torchvision reports no
ops) and registers each fake op only when torchvision's ops exist. Idempotent.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

GUARD = "_kvtier_register_fake_if_ops"
ANCHOR = "@functools.lru_cache(None)\ndef get_meta_lib():"
HELPER = f"""def {GUARD}(name):
    def wrapper(fn):
        if torchvision.extension._has_ops():
            return torch.library.register_fake(name)(fn)
        return fn

    return wrapper


"""


def patch(site: Path) -> None:
    for name in ("_C.so", "image.so"):
        (site / "torchvision" / name).unlink(missing_ok=True)
    meta = site / "torchvision" / "_meta_registrations.py"
    text = meta.read_text()
    if GUARD in text:
        return
    assert ANCHOR in text, f"{meta}: torchvision changed; update this patch"
    text = text.replace("@torch.library.register_fake(", f"@{GUARD}(")
    meta.write_text(text.replace(ANCHOR, HELPER + ANCHOR))


if __name__ == "__main__":
    patch(Path(sysconfig.get_paths()["purelib"]))
