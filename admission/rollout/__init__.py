"""What a run starts under (`plan`), how the two sides of a rollout compare (`compare`), and
two profile versions' limits side by side for the approver (`profile_diff`)."""
