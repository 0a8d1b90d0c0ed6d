"""API tokens in the admin: a superuser sees and revokes them, and nobody issues one here.

django-rest-knox's own admin lets a superuser issue a token for any user with any expiry, which
would be a global credential in one person's hands. A token is issued only by the person it
belongs to (`POST /api/auth/token/`, with the configured expiry); this page lists tokens by
owner, creation and expiry (never the digest) and revokes them, each revocation in the admin's
change log.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from knox.models import AuthToken

if admin.site.is_registered(AuthToken):
    admin.site.unregister(AuthToken)


@admin.register(AuthToken)
class AuthTokenAdmin(admin.ModelAdmin):
    list_display = ("key_prefix", "user", "created", "expiry")
    list_filter = ("created", "expiry")
    search_fields = ("user__username",)
    fields = ("key_prefix", "user", "created", "expiry")
    readonly_fields = fields
    ordering = ("-created",)

    @admin.display(description="key")
    def key_prefix(self, obj: AuthToken) -> str:
        # Enough to tell tokens apart in a list; never enough to use one.
        return f"{obj.token_key[:8]}…"

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.is_superuser)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)
