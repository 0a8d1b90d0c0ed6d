"""`POST /api/auth/token/`: a new API token for a user who signs in with HTTP Basic.

Tokens are django-rest-knox tokens: shown once, stored as a SHA-512 digest, valid for
`SLUICE_TOKEN_TTL_HOURS`. Wrong passwords count toward the sign-in lockout (django-axes) like
the admin's. Superusers revoke tokens in the admin; nobody issues one there.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from knox.views import LoginView
from rest_framework import serializers
from rest_framework.authentication import BasicAuthentication

from console.api.admission.serializers import ErrorSerializer


@extend_schema(
    tags=["auth"],
    request=None,
    responses={
        200: inline_serializer(
            name="IssuedToken",
            fields={"token": serializers.CharField(), "expiry": serializers.DateTimeField()},
        ),
        401: OpenApiResponse(ErrorSerializer, description="Missing or wrong credentials."),
    },
)
class TokenIssueView(LoginView):
    """Issue an API token to the caller, who proves who they are with HTTP Basic."""

    authentication_classes = [BasicAuthentication]
