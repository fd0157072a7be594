"""The ways out besides the signal pipeline: a Prometheus endpoint and its discovery files."""
