"""What a run is told and what follows from it: one config per concern whose fields declare
Megatron-LM's flags, the parser made from them, recipe files, the values derived once at
start-up, argparse types. Imports ``codes`` and ``runtime``.

- ``flag_fields``: a config field that declares its flag and its life on resume, and the
  parser made from fields;
- ``model_config``, ``parallel_config``, ``training_config``, ``data_config``,
  ``checkpoint_config``, ``logging_config``: the flags of each concern, with the checks that
  need only them (``validate``);
- ``run_config``: ``RunConfig``, the concerns together: built once from the parsed flags,
  validated, stored with checkpoints as their ``args`` record; the flags whose fields
  declare a resume kind, a study role, ... (``fields_where``);
- ``arguments``: the parser of pretrain_fixedcode.py and the tools, ``--preset``, the
  Megatron-LM flags refused; the parsed flags turned into the run's config;
- ``arms``: an arm as a study and the tools name it (``[NAME:]INTERFACE[@--flag=value...]``),
  parsed once, and its config over the flags;
- ``recipes``: files of flags shared by the runs of an experiment;
- ``derived``: ``Derived``: values derived at start-up, never written into the config;
- ``schedule``: the learning-rate schedule and the batch ramp in samples, as Megatron-LM
  counts them;
- ``megatron_defaults``: our defaults that differ from Megatron-LM's, said at start-up;
- ``flag_types``: argparse types and the tokenizer flags of the command lines (imports
  nothing heavy).
"""
