"""The object storage tier: chunks as objects in an S3-compatible store (``tier.ObjectStoreTier``).

``tier`` (the tier, its jobs and circuit breaker), ``client`` (the S3 client: requests, and
errors translated into kvtier's, credentials redacted).
"""
