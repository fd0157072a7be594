"""The run store: an embedded SQLite file holding runs and every signal they
logged (``schema`` is its public layout; ``writer`` fills it from the monitor
thread; ``reader`` serves the commands)."""
