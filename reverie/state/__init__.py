"""What outlives a process: checkpoints, resume, the start-up preflight, random streams and loading a saved run."""
