"""Helpers every tier may use: the job runner (``jobs``), the remote answer cache (``answers``),
the circuit breaker (``circuit``) and the chunk format with its checksums (``codec``)."""
