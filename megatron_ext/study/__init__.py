"""Studies: arms x seeds of one recipe, trained (``launch``), every checkpoint evaluated once
(``evaluation``), compared across seeds with intervals (``stats``) and reported (``report``).
``tools/study.py`` is the command line; ``spec`` defines what a study is."""
