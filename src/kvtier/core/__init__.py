"""The core: the engine-facing ``TieringManager`` and what it is built from.

Host slots (``host_slots``), promotion back from the secondary tiers (``promotion``), where each
chunk came from (``provenance``), the secondary tiers' jobs (``tier_set``) and the ``Runtime``
every engine path shares (``runtime``).
"""
