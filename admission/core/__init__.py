"""Pure-Python admission control: limits, buckets, breaker, controller, registry, evidence.

This package imports neither Django, DRF nor Celery.
"""
