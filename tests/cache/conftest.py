"""The S3-protocol server the obj tier's tests use, for ``kvtier cache`` on a bucket."""

from tests.tiers.s3_server import s3_server  # noqa: F401 (a fixture)
