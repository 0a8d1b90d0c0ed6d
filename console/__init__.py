"""Every interface of Sluice: admin pages, the REST API, forms, charts and management commands.

Nothing below `admission` or `evaluator` imports this package; it calls their services and
selectors and turns their errors into form errors, HTTP answers and command errors."""
