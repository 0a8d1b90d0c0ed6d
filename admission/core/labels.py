"""What a label or an id may look like: text a person can read and tell apart.

Profile version labels, provider ids and principal ids are shown in the admin, compared by eye
in diffs and approvals, and stored in columns of bounded width. So they are printable (no
control or format characters: no NUL, no zero-width or bidi marks, no lone surrogates), not
blank, free of surrounding whitespace and at most `MAX_LABEL_LENGTH` characters long.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_LABEL_LENGTH", "label_problem"]

MAX_LABEL_LENGTH = 128


def label_problem(value: Any, *, max_length: int = MAX_LABEL_LENGTH) -> str | None:
    """Why `value` is not an acceptable label, or None when it is."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if len(value) > max_length:
        return f"must be at most {max_length} characters"
    if not value.strip():
        return "must not be only whitespace"
    if value != value.strip():
        return "must not start or end with whitespace"
    if not value.isprintable():
        bad = next(char for char in value if not char.isprintable())
        return f"must be printable text (U+{ord(bad):04X} is a control or format character)"
    return None
