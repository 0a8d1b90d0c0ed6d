import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
application = get_wsgi_application()

# After Django is set up, in the process that serves (each gunicorn worker loads this module).
from config.telemetry import configure  # noqa: E402

configure("web")
