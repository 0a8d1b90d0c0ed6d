"""Forms of the admin pages: they validate operator input into typed form errors."""
