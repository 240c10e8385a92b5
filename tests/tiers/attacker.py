"""A writer of kvtier's media that does not run kvtier and does not know the prompts (issue 25).

    python tests/tiers/attacker.py fs ROOT MODE
    AWS_ACCESS_KEY_ID=... python tests/tiers/attacker.py s3 ENDPOINT BUCKET PREFIX MODE
    python tests/tiers/attacker.py peer PORT IDENTITY_HEX PAYLOAD_BYTES MODE KEY_HEX...

A plain script (run by path, so not even the tests' packages are imported): it imports nothing
of kvtier's. It knows what anyone who can write the medium sees, and kvtier's
published chunk format (docs: a 4096-byte header, then the payload): the identity digest is the
directory (or object prefix) name, the chunk key is the file (object) name, the payload length
is the file size less the header. It replaces every chunk it finds (fs, s3) or names (peer) with
a payload of its choosing (``PLANTED`` repeated) under a header made as ``MODE`` says:

* ``v1``: a new format-1 header with xxh3 checksums, the format kvtier writes without an
  integrity key (the attack of the finding);
* ``reuse``: the chunk's own header kept (a sealed one's key id, salt and tag included), the
  payload replaced; a peer fetches a genuine chunk for the header first;
* ``v2``: a new format-2 header naming the key id found in a chunk's header, a fresh salt and
  a random tag.

fs and s3 print ``planted <key hex>`` per chunk; peer prints ``stored <flags>``, the server's
answer to the STORE (one 0 or 1 per key).
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

import xxhash

PLANTED = b"planted!"
HEADER = 4096
V1 = struct.Struct("<8sHHI32s32sQ16s")
V2 = struct.Struct("<8sHHI32s32sQ8s32s")


def payload(length: int) -> bytes:
    return (PLANTED * (length // len(PLANTED) + 1))[:length]


def v1_header(identity: bytes, key: bytes, body: bytes) -> bytes:
    fields = V1.pack(
        b"KVTCHUNK", 1, 1, HEADER, identity, key, len(body), xxhash.xxh3_128_digest(body)
    )
    check = struct.pack("<Q", xxhash.xxh3_64_intdigest(fields))
    return (fields + check).ljust(HEADER, b"\0")


def v2_header(identity: bytes, key: bytes, body: bytes, genuine: bytes) -> bytes:
    key_id = genuine[88:96] if genuine[8:10] == b"\x02\x00" else os.urandom(8)
    fields = V2.pack(b"KVTCHUNK", 2, 2, HEADER, identity, key, len(body), key_id, os.urandom(32))
    return (fields + os.urandom(16)).ljust(HEADER, b"\0")


def planted_chunk(mode: str, identity: bytes, key: bytes, length: int, genuine: bytes) -> bytes:
    body = payload(length)
    if mode == "v1":
        return v1_header(identity, key, body) + body
    if mode == "reuse":
        return genuine[:HEADER] + body
    return v2_header(identity, key, body, genuine) + body


def attack_fs(root: str, mode: str) -> None:
    for namespace in Path(root).iterdir():
        if not namespace.is_dir():
            continue
        identity = bytes.fromhex(namespace.name)
        for path in namespace.glob("??/??/*"):
            if len(path.name) != 64 or not path.is_file():
                continue
            genuine = path.read_bytes()
            chunk = planted_chunk(
                mode, identity, bytes.fromhex(path.name), len(genuine) - HEADER, genuine
            )
            path.write_bytes(chunk)
            print("planted", path.name, flush=True)


def attack_s3(endpoint: str, bucket: str, prefix: str, mode: str) -> None:
    """With the bucket's credentials (``AWS_ACCESS_KEY_ID``, ... in the environment): boto3."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    listing = s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")
    for name in [item["Key"] for item in listing.get("Contents", [])]:
        *_, digest, key = name.split("/")
        if len(key) != 64:
            continue  # identity.json
        genuine = s3.get_object(Bucket=bucket, Key=name)["Body"].read()
        length = len(genuine) - HEADER
        chunk = planted_chunk(mode, bytes.fromhex(digest), bytes.fromhex(key), length, genuine)
        s3.put_object(Bucket=bucket, Key=name, Body=chunk)
        print("planted", key, flush=True)


def attack_peer(port: int, identity: bytes, length: int, mode: str, keys: list[bytes]) -> None:
    import msgpack
    import zmq

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    sock.connect(f"tcp://127.0.0.1:{port}")

    def ask(kind: int, req_id: int, body: object, frames: list[bytes] | None = None) -> list[bytes]:
        sock.send_multipart(
            [msgpack.packb([kind, req_id, body], use_bin_type=True), *(frames or [])]
        )
        return sock.recv_multipart()

    ask(1, 1, [2, identity])  # HELLO [protocol version, identity digest]
    genuine = bytes(HEADER)
    if mode != "v1":  # FETCH one of them: a header the server made, sealed if it seals
        reply = ask(3, 2, [keys[0]])
        genuine = reply[1] if len(reply) > 1 else genuine
    frames = []
    for key in keys:
        chunk = planted_chunk(mode, identity, key, length, genuine)
        frames += [chunk[:HEADER], chunk[HEADER:]]
    flags = msgpack.unpackb(ask(4, 3, keys, frames)[0])[2]  # STORE
    print("stored", "".join(str(int(f)) for f in flags), flush=True)


def main(argv: list[str]) -> None:
    tier, *args = argv
    if tier == "fs":
        attack_fs(args[0], args[1])
    elif tier == "s3":
        attack_s3(*args)
    else:
        port, identity, length, mode, *keys = args
        attack_peer(
            int(port), bytes.fromhex(identity), int(length), mode, [bytes.fromhex(k) for k in keys]
        )


if __name__ == "__main__":
    main(sys.argv[1:])
