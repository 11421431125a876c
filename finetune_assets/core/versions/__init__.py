"""Dataset version keys."""
