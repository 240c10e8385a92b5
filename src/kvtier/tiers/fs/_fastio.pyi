ABI: int

#: The namespace as pinned (``kvtier.tiers.fs.pin``): descriptor, path, st_dev, st_ino.
Pin = tuple[int, bytes, int, int]

def store(
    pin: Pin,
    level1: bytes,
    level2: bytes,
    tmp: bytes,
    name: bytes,
    header: bytes | memoryview,
    payload: bytes | memoryview,
    truncate_to: int,
    flags: int,
    fsync: bool,
    dir_mode: int,
    file_mode: int,
    fold_at: int,
    piece: int,
    /,
) -> None: ...
def load(
    pin: Pin,
    path: bytes,
    header: bytes | memoryview,
    plain: bytes | memoryview,
    aligned: bytes | memoryview,
    flags: int,
    adaptive: bool,
    o_direct: int,
    fold: int,
    /,
) -> tuple[int, int, int, int, bool, bytes | None] | None: ...
def scan_chunks(
    dir_fd: int, links: bool, link_offset: int, depth: int, /
) -> tuple[bytes, bytes]: ...
