"""The test suite's environment, set before pytest-django loads the settings (`-p` in pyproject).

Tests talk plain HTTP to loopback servers and need a secret key like any deployment with DEBUG
off; the key is random per test session and shared with the servers the suite starts.
Throttle counters stay in each process's memory unless a test asks for Redis itself.
"""

from __future__ import annotations

import os
import secrets

os.environ.setdefault("DJANGO_SECRET_KEY", "test-session-" + secrets.token_urlsafe(48))
os.environ.setdefault("DJANGO_HTTPS", "0")
os.environ.setdefault("SLUICE_CACHE_URL", "locmem://")
