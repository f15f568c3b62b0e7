"""What training reads: tokenizers, Megatron GPT datasets and loaders, the indexed format (reader,
writer, checks), index caches, held-out windows.

- ``tokenizer``: NullTokenizer, sentencepiece and Hugging Face tokenizers;
- ``gpt_datasets``: Megatron-Core GPT datasets, the resumable batch sampler, the loaders;
- ``indexed``: the indexed ``.bin/.idx`` format, read (and checked against its ``.bin``) and
  written with numpy alone;
- ``split_checks``: the splits training takes checked before Megatron-Core builds datasets;
- ``cache``: the dataset index caches of ``--data-cache-path``;
- ``held_out``: held-out token windows (study evaluation, probes).
"""
