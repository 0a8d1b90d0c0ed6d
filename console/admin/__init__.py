"""The admin site's pages for both apps, registered when Django discovers `console.admin`."""

from console.admin import profiles, rollout, runs  # noqa: F401  (registers the model admins and pages)
