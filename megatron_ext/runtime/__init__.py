"""The process a run lives in: start-up, devices, signals, what the ranks agree on, logging and
crash-safe files. Imports no other folder of the package.

- ``errors``: the typed errors the library raises (the entry points turn them into ``error:
  ...`` and an exit status);
- ``files``: the one atomic writer, and fingerprints for resuming;
- ``log``: the logging convention (one rank prints);
- ``reductions``: what the ranks agree on, one all-reduce each;
- ``exit_signals``: SIGTERM/SIGUSR1 caught from the first step;
- ``helper_processes``: every forked helper (checkpoint writers, their queue's Manager, data
  loader workers) dies with its parent, ``kill -9`` included;
- ``megatron_compat``: where the supported megatron-core releases (0.16.1 to 0.19.x) differ,
  each difference named with its release and asked of the installed package;
- ``cpu_backend``: Megatron-Core on CPU over gloo (tests and the demo);
- ``initialize``: device choice, torch.distributed, parallel state, seeds;
- ``device_checks``: GPU start-up checks (CUDA connections, FP8 recipes, the Transformer Engine
  pin).
"""
