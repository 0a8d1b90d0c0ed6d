"""Who may read and write a workspace through the API: the `admission.access` rule."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from admission import access


class WorkspaceActPermission(BasePermission):
    """The caller must see the workspace (else 404), and may do the view's act in it (else 403).

    Views expose `get_workspace()`, which raises NotFound for a workspace the caller cannot
    see, so nobody learns whether a workspace they do not belong to exists; reads need the
    view's `read_act` and other methods its `write_act` (None: the view does not write).
    """

    def has_permission(self, request: Request, view: Any) -> bool:
        workspace = view.get_workspace()
        act = view.read_act if request.method in SAFE_METHODS else view.write_act
        if act is None:
            # The view has no handler for this method: it answers 405, not a refusal.
            return True
        if not access.can(request.user, act, workspace):
            self.message = str(access.AccessDenied(act, workspace))
            return False
        return True
