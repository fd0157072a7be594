"""The backend's side of the child: spawning it, supervising it, reading its records."""
