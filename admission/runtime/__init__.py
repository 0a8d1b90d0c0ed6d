"""The per-process side of admission: the registry of controllers, its refresh, live operations."""
