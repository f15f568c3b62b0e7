"""What training reads: tokenizers, Megatron GPT datasets and loaders, the indexed format (reader,
writer, checks), index caches, held-out windows.

- ``tokenizer``: NullTokenizer, sentencepiece and Hugging Face tokenizers;
- ``gpt_datasets``: Megatron-Core GPT datasets, the resumable batch sampler, the loaders;
- ``indexed``: the indexed ``.bin/.idx`` format: read, checked, written;
- ``cache``: the dataset index caches of ``--data-cache-path``;
- ``held_out``: held-out token windows (study evaluation, probes).
"""
