"""Settings of a worker whose load runs hold still while a file exists (test_load_runs): the
project's settings plus an app that hooks `evaluator.services.load_runs.on_progress`."""

from config.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.service.held_load_run.HeldLoadRunConfig"]  # noqa: F405
