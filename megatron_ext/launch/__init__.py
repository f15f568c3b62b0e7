"""Launching runs on a cluster.

- ``slurm``: Slurm batch scripts filled from slurm/, submission, and the jobs already queued;
- ``plan``: a run planned before it is queued: memory per GPU, time, GPU-hours.
"""
