"""What runs in the training backend: the monitor, its thread, and the path
from a ring record to the sink (read, stamp with the model's age, emit)."""
