"""The project's routes plus two that fail on purpose, for the error-page tests."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.urls import path

from config.urls import handler400, handler403, handler404, handler500, urlpatterns

__all__ = ["handler400", "handler403", "handler404", "handler500", "urlpatterns"]


def fail(request: HttpRequest) -> HttpResponse:
    database = settings.DATABASES["default"]
    secret_key = settings.SECRET_KEY
    raise RuntimeError(f"failing on purpose with {len(database)} database keys, {len(secret_key)}")


urlpatterns = [path("api/boom/", fail), path("boom/", fail), *urlpatterns]
