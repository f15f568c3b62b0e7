"""Studies: arms x seeds of one recipe, optionally x factors' levels and token budgets
(``spec``; budgets as WSD cooldown branches, ``budgets``), trained here or on Slurm
(``launch``), every checkpoint evaluated once with its training FLOPs (``evaluation``), the
final ones probed with ``[probes]`` (``probing``), compared across seeds with intervals
(``stats``) and what each comparison's design can detect (``power``), against the arms'
trainable input parameters (``capacity``), across levels against compute with a power-law
fit (``scaling``, a folder: the analysis, the paper's target, the section and its figures;
the laws in ``fit``), each arm at its best level of a tuned factor such as the learning rate
(``tuning``), and reported (``report``); every interval the reports print is simulated from
a known truth by the calibration suite (``calibration``, a folder of its own).
``tools/study.py`` and ``tools/calibrate.py`` are the command lines."""
