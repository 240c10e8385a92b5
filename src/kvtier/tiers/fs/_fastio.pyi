ABI: int

def store(
    namespace: bytes,
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
    /,
) -> None: ...
def load(
    path: bytes,
    header: bytes | memoryview,
    plain: bytes | memoryview,
    aligned: bytes | memoryview,
    flags: int,
    adaptive: bool,
    o_direct: int,
    /,
) -> tuple[int, int, int, int, bool] | None: ...
