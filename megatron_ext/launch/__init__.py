"""Launching runs on a cluster.

- ``slurm``: Slurm batch scripts filled from slurm/, and submission;
- ``plan``: a run planned before it is queued: memory per GPU, time, GPU-hours.
"""
