"""From a record to the sinks: step stamping, emission, statistics, the signal pipeline's adapters."""
