"""Admission's write paths: profile versions and their approvals, rollout controls."""
