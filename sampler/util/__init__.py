"""Small helpers every layer uses: bounded quoting, atomic files, rate-limited warnings."""
