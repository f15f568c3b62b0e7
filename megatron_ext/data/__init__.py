"""Corpus preparation for pretraining: read inputs, tokenize, write Megatron indexed datasets.

The command-line tools ``tools/preprocess_data.py`` and ``tools/train_tokenizer.py`` are thin
drivers over the modules here. User errors (bad input, flags, files) end the run with
``SystemExit("error: ...")``, as everywhere in the project.
"""
