"""Who may read and write a workspace's profiles through the API."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request


class WorkspaceAccess(BasePermission):
    """The caller must see the workspace (else 404); proposing also needs `add_profileversion`.

    Views expose `get_workspace()`, which raises Http404 for an invisible workspace, so a
    caller never learns whether a workspace it does not belong to exists.
    """

    message = "You may not propose profile versions."

    def has_permission(self, request: Request, view: Any) -> bool:
        view.get_workspace()
        if request.method in SAFE_METHODS:
            return True
        return bool(request.user.has_perm("admission.add_profileversion"))
