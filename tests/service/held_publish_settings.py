"""Settings of a web process whose doorbells wait while a file exists (test_lost_runs): the
project's settings plus an app that hooks `evaluator.services.doorbell.before_ring`."""

from config.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.service.held_publish.HeldPublishConfig"]  # noqa: F405
