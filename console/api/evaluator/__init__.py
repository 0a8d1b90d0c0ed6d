"""REST API for evaluation runs and load runs."""
