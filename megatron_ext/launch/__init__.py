"""Launching runs on a cluster.

- ``slurm``: Slurm batch scripts filled from slurm/, and submission.
"""
