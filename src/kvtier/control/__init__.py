"""The operator's controls: admission, retention, the SLO guard, tier switches, the admin
endpoint."""
