"""Tasks: one contract per data set."""
