"""What a run starts under (`plan`) and how the two sides of a rollout compare (`compare`)."""
