"""Server-drawn SVG charts for the admin pages (no JavaScript)."""
