"""Studies: arms x seeds of one recipe (``spec``), trained here or on Slurm (``launch``),
every checkpoint evaluated once (``evaluation``), the final ones probed with ``[probes]``
(``probing``), compared across seeds with intervals (``stats``) and reported (``report``).
``tools/study.py`` is the command line."""
