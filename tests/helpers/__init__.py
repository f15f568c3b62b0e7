"""What the test modules share that is not a fixture (fixtures are in tests/conftest.py):
reference computations, the workers torchrun starts, small models, datasets and recipes.

- ``code_reference``: every code computed in plain Python, the reference of the tests;
- ``parallel_worker``, ``tp_parity_worker``, ``norms_worker``: the processes torchrun starts;
- ``signals``: the entry point as a subprocess, signalled mid-run;
- ``small_model``: the embedding tests' small model;
- ``indexed_data``: tiny indexed datasets and the datasets training builds from them;
- ``checkpoint_files``: stand-in saves (files, manifest, marker) without a training;
- ``recipes``: a tiny study recipe;
- ``saves``: an older or newer save made from a current one (its common objects rewritten).
"""
