"""Helpers every tier may use: the job runner (``jobs``), the remote answer cache (``answers``),
the circuit breaker (``circuit``), the chunk format with its checksums (``codec``), and sealed
chunks: keyed tags and encryption (``sealing``) under integrity key files (``integrity_key``)."""
