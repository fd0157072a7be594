"""What users look at: plots and the live terminal view."""
