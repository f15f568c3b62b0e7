"""The training loop and its policies, as torchtitan separates them.

- ``setup``: the flags checked against the machine and the tokenizer, the layers settled, the
  checkpoint resolved, the model and optimizer built (one ``TrainingSetup``);
- ``loop``: ``pretrain``, the loop itself, with its teardown in one place;
- ``fused_adam``: torch's fused AdamW where neither TE nor Apex supplies a FusedAdam;
- ``compile_layers``: torch.compile of each transformer layer, and its compile time logged;
- ``step``: one training step, and the one count of skipped updates (which stops a run
  after ``--max-nonfinite-steps`` failures in a row);
- ``spikes``: ``--check-for-spiky-loss``, a loss far above the first ones;
- ``validation``: when and how the loop validates;
- ``exit_conditions``: when a run stops early;
- ``gc_policy``: the one garbage-collection policy (``--manual-gc``);
- ``profiling``: ``--profile``, a window of steps recorded;
- ``run_status``: whether the run was done or stopped early, for its batch script.
"""
