"""Corpus preparation for pretraining: read inputs, tokenize, write Megatron indexed datasets.

``preprocess`` (the job: inputs to datasets), ``preprocess_config`` (the job's flags, declared
once, and their checks), ``readers`` (find the inputs, cut them
into byte ranges or stream them, parse them), ``pieces`` (the workers' pieces of compressed
files, Parquet row groups and Arrow record batches), ``shards`` (``--shard I/N``: the input
files of one node of a split job), ``tasks`` (the workers' tasks, planned and run in
input order), ``encode`` (a task's texts to token ids, written by the worker processes), ``gigatoken_encoder``
(gigatoken for every text where it gives the reference library's ids, routed before encoding),
``characters`` (which texts hold only characters a check admits, in linear time),
``character_table`` (gigatoken's character table, computed once per tokenizer and cached
beside it), ``word_cache``
(sentencepiece BPE a word at a time, and the cache of words' ids), ``byte_level`` (byte-level
BPE a word at a time), ``parts`` (the resumable work folder of a job),
``merge`` (the parts, or whole datasets, into one dataset under its final name), ``tokenizer_training`` (a
tokenizer trained from the same inputs), ``check`` (a dataset's report: token ids against a
vocabulary and a code, its splits). The indexed format itself, read and written, is
megatron_ext/datasets/indexed.py, and the checks of a dataset's splits before it is used are
megatron_ext/datasets/split_checks.py, since training does them too. The command-line tools
``tools/preprocess_data.py``, ``tools/merge_datasets.py``, ``tools/train_tokenizer.py`` and
``tools/check_data.py`` are thin
drivers over the modules here: ``tools/preprocess_data.py`` makes its parser from
``PreprocessConfig``'s fields and hands the job that config, not its parsed flags. User errors
(bad input, flags, files) are raised as the typed errors of megatron_ext/runtime/errors.py, which
the tools turn into ``error: ...`` lines, as everywhere in the project.
"""
