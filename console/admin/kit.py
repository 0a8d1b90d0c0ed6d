"""What every admin page shares: the page around a form, and reporting a service's refusal.

`admin_page` renders a page of a model's admin (the site's context, the model's options for the
breadcrumbs, a title and the page's own context); a form page's template includes
`admin/console/form_fields.html` for its fields. `create_page` is a whole add page whose object a
service creates: the form until it validates and the service accepts it, then the new object's
page.

A refusal is a `ServiceError` (admission.core) raised by a service, or `access.AccessDenied`.
An action over selected objects reports each one as an error message (`report_refusal`); a form
page shows it on the form (`form_refusal`), at the field it names when the form has that field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from admission import access
from admission.core import ServiceError

__all__ = [
    "REFUSALS",
    "FormPage",
    "admin_page",
    "create_page",
    "form_refusal",
    "refusal_text",
    "report_refusal",
]

# What an admin page catches around a service call and reports instead of failing.
REFUSALS = (ServiceError, access.AccessDenied)


def admin_page(
    model_admin: Any, request: HttpRequest, template: str, *, title: str, **context: Any
) -> TemplateResponse:
    """A page of `model_admin`'s model: the admin site's context, the model's options, `title`
    and the page's own `context` (its form, its objects, ...)."""
    page = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": title,
        **context,
    }
    return TemplateResponse(request, template, page)


@dataclass(frozen=True)
class FormPage:
    """How a form page reads: its template, title and whatever else the template shows;
    `document` names the form field holding a document that a refusal's field points into."""

    template: str
    title: str
    context: Mapping[str, Any] = field(default_factory=dict)
    document: str | None = None


def create_page(
    model_admin: Any,
    request: HttpRequest,
    form_class: Callable[..., forms.Form],
    create: Callable[[forms.Form], tuple[Any, str]],
    page: FormPage,
) -> HttpResponse:
    """An add page whose object a service creates: `form_class` (built with the signed-in user)
    until it validates, then `create(form)`, which returns the object and the success message;
    a refusal is shown on the form, a success sends the user to the new object's page."""
    if not model_admin.has_add_permission(request):
        raise PermissionDenied
    if request.method == "POST":
        form = form_class(request.POST, user=request.user)
        if form.is_valid():
            try:
                created, message = create(form)
            except REFUSALS as error:
                form_refusal(form, error, document=page.document)
            else:
                model_admin.message_user(request, message, messages.SUCCESS)
                opts = model_admin.opts
                change = f"admin:{opts.app_label}_{opts.model_name}_change"
                return HttpResponseRedirect(reverse(change, args=[created.pk]))
    else:
        form = form_class(user=request.user)
    return admin_page(
        model_admin, request, page.template, title=page.title, form=form, **page.context
    )


def refusal_text(error: Exception) -> str:
    """The refusal in one line, naming its field."""
    return error.summary() if isinstance(error, ServiceError) else str(error)


def report_refusal(
    model_admin: Any, request: HttpRequest, error: Exception, *, about: object = None
) -> None:
    """An error message for the refusal, naming `about` (the object acted on) unless the
    refusal names it already."""
    text = refusal_text(error)
    if about is not None and str(about) not in text:
        text = f"{about}: {text}"
    # A word first: the admin capitalises a message's first letter, not a key's.
    model_admin.message_user(request, f"Refused: {text}", messages.ERROR)


def form_refusal(form: forms.Form, error: Exception, *, document: str | None = None) -> None:
    """Show the refusal on `form`: at the field it names when the form has it, else at
    `document` (the form field holding a document the refusal points into), else above the
    form."""
    if isinstance(error, ServiceError):
        for name in (error.document, error.field):
            if name is not None and name in form.fields:
                for reason in error.reasons():
                    form.add_error(name, reason)
                return
        if error.field and document is not None:
            form.add_error(document, error.summary())
            return
    form.add_error(None, refusal_text(error))
