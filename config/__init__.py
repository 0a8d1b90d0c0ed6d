"""Sluice's project package; the Celery app is imported here so `shared_task` binds to it."""

from config.celery import app as celery_app

__all__ = ["celery_app"]
