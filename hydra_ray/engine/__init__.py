"""The one engine every launcher runs its jobs with: Ray tasks, the body of a job
in a worker, the gather of outputs from other nodes, and what the user reads."""
