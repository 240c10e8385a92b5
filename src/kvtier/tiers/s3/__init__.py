"""The object storage tier: chunks as objects in an S3-compatible store (``tier.ObjectStoreTier``).

``tier`` (the tier, its jobs and circuit breaker), ``client`` (the S3 client: requests, and
errors translated into kvtier's, credentials redacted), ``bodies`` (sealing and opening objects),
``tracker`` (per-key requests into job results); with ``max_bytes``/``max_age_s``: ``bound``
(the index and deletes), ``listing`` (the paged rebuild of the index), ``upkeep`` (its thread).
"""
