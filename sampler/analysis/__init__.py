"""Reading a finished (or running) run for answers: where it was slow, and why."""
