"""The scaling section of a study with factors: the held-out loss and the gap to the control
against training compute over every level, and the saturating power-law fit of each arm
(:mod:`..fit`) extrapolated to the paper's model and budget; :mod:`..report` writes it into
the top ``STUDY.md`` after every level's tables.

``analysis``: the points, the gaps paired by seed and the fit, in compute or in model size
and budget. ``target``: the paper's model and budget the fit extrapolates to.
``section``: the section's markdown. ``figures``: its FLOPs figures.
"""
