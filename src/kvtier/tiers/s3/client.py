"""ObjectClient: the few S3 requests the object tier makes, on obstore, with errors translated.

obstore (Rust ``object_store`` underneath) was kept over boto3 by measurement against the same
local server (the ``clients`` section of ``benchmarks/obj_tier.py``): level on throughput (the
local server is the limit), but it needs about half boto3's client CPU per GB on puts and about
three quarters on 2 MiB gets (level on 8 MiB gets), CPU the serving engine shares. It also
releases the GIL for the whole request and bounds it with one timeout.

Errors leave this module in three shapes only: ``None``/``False`` for an object that is not there,
``TierUnavailable`` when the endpoint cannot be reached or fails (connection refused, timeout,
5xx), and ``TierError`` with a ``code`` when it refuses us (``credentials``, ``bucket``). Messages
are built here; the client's own text is reduced to its first line with every credential removed.

Every request is bounded: one attempt, ``timeout_s`` for connecting and for the whole request.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import obstore
from obstore.store import S3Store

from kvtier.config.addresses import redact_url, redact_urls
from kvtier.errors import ConfigError, IntegrityError, TierError, TierUnavailable
from kvtier.tiers.s3.config import ObjTierConfig

#: One object of a listing: its name, size in bytes, and last modified time (Unix seconds).
Listed = tuple[str, int, float]

#: How much of a client error's text is read: an endpoint chooses its error bodies, and the
#: client puts them whole in the text (status and S3 code come first).
MAX_ERROR_TEXT = 4096

_STATUS = re.compile(r"status code: (\d{3})")
_S3_CODE = re.compile(r"<Code>(\w+)</Code>")
_CREDENTIAL_CODES = frozenset(
    {
        "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken",
        "InvalidToken", "InvalidClientTokenId", "AuthorizationHeaderMalformed",
    }
)  # fmt: skip


class ObjectRefused(TierError):
    """The endpoint answered but refused the request; ``code`` is ``credentials`` or ``bucket``."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class ObjectClient:
    """Blocking get/put/head of whole objects in one bucket; safe to share between threads."""

    def __init__(self, config: ObjTierConfig) -> None:
        self.bucket = config.bucket
        self.endpoint = redact_url(config.endpoint_override or "AWS S3")  # named in errors
        self._secrets = [s for s in (config.access_key, config.secret_key) if s]
        options = _store_options(config)
        try:
            self._store = S3Store(config.bucket, **options)
        except Exception as exc:
            reason = self._first_line(str(exc))
            raise ConfigError(f"obj tier: cannot build the S3 client: {reason}") from None

    def put(self, name: str, data: memoryview) -> None:
        """Write ``data`` as object ``name`` in one request. A put answered 404 stored nothing:
        an error (``ObjectRefused`` for a missing bucket), never "not there"."""
        self._call(obstore.put, self._store, name, data, use_multipart=False, missing=False)

    def get_into(
        self, name: str, views: Iterable[memoryview], last: Any | None = None
    ) -> int | None:
        """Stream object ``name`` into ``views``, filled in order; returns the object's size.
        ``last.feed(n)`` is called each time bytes land in the last view (``n``: its bytes
        filled so far), to hash them while they are in cache (``codec.filling``).

        ``None`` when there is no such object. An object larger than the views together raises
        ``IntegrityError`` (reason ``length``); a smaller one returns its (short) size.
        """
        result = self._call(obstore.get, self._store, name)
        if result is None:
            return None
        # min_chunk_size=0: network buffers come through as received, not re-buffered, so the
        # copy into the views is the only one.
        size: int = self._call(_fill, result.stream(min_chunk_size=0), list(views), last)
        return size

    def exists(self, name: str) -> bool:
        return self.size_of(name) is not None

    def size_of(self, name: str) -> int | None:
        """The size of object ``name`` (one HEAD request); ``None`` when there is none."""
        meta = self._call(obstore.head, self._store, name)
        return None if meta is None else int(meta["size"])

    def delete(self, name: str) -> None:
        """Delete object ``name``; one that is not there is no error (S3 answers 204)."""
        self._call(obstore.delete, self._store, name)

    def list_pages(self, prefix: str, after: str | None, page_size: int) -> Iterator[list[Listed]]:
        """Objects under ``prefix/`` whose names sort after ``after``, in name order, as pages
        of at most ``page_size`` (name, size, last modified as a Unix time).

        Lazy: each page is fetched when asked for (S3 returns up to 1,000 names a request; the
        client hands them out ``page_size`` at a time), so a listing of any size holds one
        request's worth in memory. Every page can raise as a request does.
        """
        stream = self._call(obstore.list, self._store, prefix, offset=after, chunk_size=page_size)
        pages = iter(stream)
        while (page := self._call(next, pages, None)) is not None:
            yield [(m["path"], int(m["size"]), m["last_modified"].timestamp()) for m in page]

    def check_bucket(self, probe_name: str) -> None:
        """List at most one object: proves the endpoint, the bucket and the credentials."""
        self._call(lambda: next(iter(obstore.list(self._store, probe_name, chunk_size=1)), None))

    def _call(self, fn: Any, *args: Any, missing: bool = True, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, errors translated; ``None`` for an object that is not there
        (a 404) where ``missing`` says that answer means that, else a 404 is an error too."""
        try:
            return fn(*args, **kwargs)
        except FileNotFoundError as exc:
            if missing:
                return None
            raise self._translate(exc) from None
        except IntegrityError:
            raise
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # obstore turns a Rust panic into a BaseException
            raise self._translate(exc) from None

    def _translate(self, exc: BaseException) -> TierError:
        text = str(exc)[:MAX_ERROR_TEXT]
        status = _STATUS.search(text)
        code = _S3_CODE.search(text)
        reason = code.group(1) if code else f"HTTP {status.group(1)}" if status else ""
        if reason == "NoSuchBucket":
            where = f"bucket {self.bucket!r} does not exist at {self.endpoint}"
            return ObjectRefused(where, "bucket")
        if reason in _CREDENTIAL_CODES or reason in ("HTTP 401", "HTTP 403"):
            return ObjectRefused(
                f"{self.endpoint} rejected the credentials for bucket {self.bucket!r} ({reason}); "
                "check access_key/secret_key or the AWS_* environment",
                "credentials",
            )
        return TierUnavailable(f"{self.endpoint}: {self._first_line(text)}")

    def _first_line(self, text: str) -> str:
        text = text[:MAX_ERROR_TEXT]
        line = text.strip().splitlines()[0] if text.strip() else "request failed"
        for secret in self._secrets:
            line = line.replace(secret, "***")
        return redact_urls(line)[:300]


def _fill(chunks: Iterable[memoryview | bytes], views: list[memoryview], last: Any) -> int:
    """Copy consecutive ``chunks`` across ``views`` in order (feeding ``last``, if any, what
    lands in the last view); returns the bytes received."""
    total, index, offset = 0, 0, 0
    for chunk in chunks:
        data = memoryview(chunk)
        total += len(data)
        while data:
            if index == len(views):
                raise IntegrityError(f"object is longer than the {total} bytes expected", "length")
            n = min(len(data), len(views[index]) - offset)
            views[index][offset : offset + n] = data[:n]
            data, offset = data[n:], offset + n
            if last is not None and index == len(views) - 1:
                last.feed(offset)
            if offset == len(views[index]):
                index, offset = index + 1, 0
    return total


def _shown(endpoint: str) -> str:
    """``endpoint`` for an error message: credentials in it are never shown."""
    if "@" in endpoint and "://" not in endpoint:
        return "a value with '@' (not shown: it may hold credentials)"
    return repr(redact_url(endpoint))


def _check_endpoint(endpoint: str | None) -> None:
    if endpoint is None:
        return
    url = urlsplit(endpoint)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ConfigError(
            f"endpoint_override: expected a URL such as http://minio:9000, got {_shown(endpoint)}"
        )


def _store_options(config: ObjTierConfig) -> dict[str, Any]:
    _check_endpoint(config.endpoint_override)
    timeout = timedelta(seconds=config.timeout_s)
    options: dict[str, Any] = {
        "client_options": {
            "timeout": timeout,
            "connect_timeout": timeout,
            "allow_http": (config.endpoint_override or "").startswith("http://"),
        },
        "retry_config": {
            "max_retries": 0,
            "retry_timeout": timeout,
            "backoff": {"init_backoff": timeout, "max_backoff": timeout, "base": 2},
        },
        **_credentials(config),
    }
    if config.endpoint_override:
        options["endpoint"] = config.endpoint_override
    region = config.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region or config.endpoint_override:
        options["region"] = region or "us-east-1"
    return options


def _credentials(config: ObjTierConfig) -> dict[str, Any]:
    """Keys from the config, else the environment (read by obstore), else boto3's chain."""
    if bool(config.access_key) != bool(config.secret_key):
        raise ConfigError("access_key, secret_key: give both or neither")
    if config.access_key:
        return {"access_key_id": config.access_key, "secret_access_key": config.secret_key}
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        return {}
    try:
        from obstore.auth.boto3 import Boto3CredentialProvider

        return {"credential_provider": Boto3CredentialProvider()}
    except (ImportError, ValueError):
        return {}  # obstore's own chain: web identity, container and instance metadata
    except Exception as exc:
        raise TierError(f"AWS credential chain failed: {type(exc).__name__}: {exc}") from None
