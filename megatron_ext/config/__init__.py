"""What a run is told and what follows from it: Megatron-LM's flags, recipe files, the values
settled once at start-up, argparse types. Imports ``codes`` and ``runtime``.

- ``arguments``: Megatron-LM's flags plus the fixed-code flags, parsed;
- ``run_config``: the flags as typed configs, one per concern, each with the checks that need
  only the flags (``validate``);
- ``recipes``: files of flags shared by the runs of an experiment;
- ``derived``: ``Derived`` and ``Resolved``: values settled at start-up, never written into the
  flags;
- ``schedule``: the learning-rate schedule and the batch ramp in samples, as Megatron-LM
  counts them;
- ``megatron_defaults``: our defaults that differ from Megatron-LM's, said at start-up;
- ``flag_types``: argparse types and choices of the command lines (imports nothing heavy).
"""
