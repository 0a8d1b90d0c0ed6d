"""API token authentication: django-rest-knox tokens (stored as digests, with an expiry)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from knox.auth import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed


class ApiTokenAuthentication(TokenAuthentication):
    """`Authorization: Token <token>`; any malformed token is a 401, never a server error."""

    def authenticate_credentials(self, token: bytes) -> tuple[Any, Any]:
        try:
            token.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid token.") from None
        return super().authenticate_credentials(token)


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """The token scheme in the OpenAPI schema: `Authorization: Token <token>`."""

    target_class = ApiTokenAuthentication
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <token>`: a token from POST /api/auth/token/ or the admin.",
        }
