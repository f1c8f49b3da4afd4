"""Operations: the Grafana dashboard, the alert rules and what they may name (docs/operations.md)."""
