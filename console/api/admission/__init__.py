"""REST API for workspaces, profile versions and the profile-change history."""
