"""The public face: ``ResourceMonitor``, the process-wide monitor, integrations."""
