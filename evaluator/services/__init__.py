"""The evaluator's web-side services: submitting, preparing, finishing and cancelling runs."""
