"""The ways out to Prometheus: the metric table, the child's endpoint and its discovery entry."""
