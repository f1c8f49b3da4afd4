"""Operations: the Grafana dashboard, the Prometheus alert rules and what they may name (docs/operations.md)."""
