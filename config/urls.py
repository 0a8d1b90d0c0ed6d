from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from console.admin import tokens as token_admin  # noqa: F401  (replaces the token library's admin)
from console.admin.dashboard import dashboard_view
from console.admin.usage import usage_view
from console.api.schemas import EvaluationSchemaView, ProfileSchemaView
from console.api.tokens import TokenIssueView

urlpatterns = [
    # The operator's dashboard, inside the admin (its login and staff check).
    path(
        "admin/admission/live/", admin.site.admin_view(dashboard_view), name="admission-dashboard"
    ),
    path("admin/usage/", admin.site.admin_view(usage_view), name="usage"),
    path("admin/", admin.site.urls),
    path("runbooks/", include("console.runbooks")),
    # The evaluator's routes first: its what-if route lies under a profile's, whose label may
    # hold "/" and would otherwise swallow it.
    path("api/", include("console.api.evaluator.urls")),
    path("api/", include("console.api.admission.urls")),
    path("api/auth/token/", TokenIssueView.as_view(), name="api-token"),
    path("api/schemas/profile.json", ProfileSchemaView.as_view(), name="profile-schema"),
    path("api/schemas/evaluation.json", EvaluationSchemaView.as_view(), name="evaluation-schema"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves Swagger UI's start-up script as a file: the page needs no inline script.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
]

# Under /api/ these answer the API's typed JSON error; elsewhere Django's plain pages.
handler400 = "console.api.errors.bad_request"
handler403 = "console.api.errors.permission_denied"
handler404 = "console.api.errors.page_not_found"
handler500 = "console.api.errors.server_error"
