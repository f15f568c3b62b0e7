"""Checkpoints: the layout of a save and of a ``--save`` folder, loading, the resume policy,
what a resume must match, saving (sync or async), manifests and retention.

- ``layout``: the ``iter_N`` naming, the marker, completed saves, the train state and provenance
  a save carries, its sharded state;
- ``loading``: a save verified and loaded (model, optimizer, scheduler, random states);
- ``saved_args``: ``--use-checkpoint-args``: the model flags read from the checkpoint;
- ``resume``: which checkpoint a run starts from (``--save`` against ``--load``, the run's own
  saves) and its fixed code;
- ``compatibility``: what a resume must share with its checkpoint (model, schedule, layout);
- ``torch_adam``: the fix that lets megatron-core 0.16.1 resume a distributed optimizer over
  torch's Adam;
- ``saving``: writing saves (the Checkpointer), sync or async;
- ``manifest``: each save's files with sizes and checksums;
- ``retention``: which saves are kept;
- ``lease``: one run at a time saves into a ``--save`` directory.
"""
