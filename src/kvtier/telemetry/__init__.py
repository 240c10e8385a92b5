"""What kvtier reports: Prometheus metrics and their HTTP endpoint, KV events, throttled logs."""
