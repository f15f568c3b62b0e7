"""Hugging Face export and evaluation of fixedcode checkpoints.

``configuration_fixedcode`` / ``modeling_fixedcode``: the custom HF model of the fixed-code
arms (copied next to exported weights; they import nothing from megatron_ext).
``megatron_checkpoint``: read a dist_checkpointing checkpoint into one CPU model.
``convert``: the weight and config mapping to Llama. ``export``: a checkpoint written as
a Hugging Face model, optionally validated. ``tokenizer``: tokenizer files.
``parity``: logits and generation checks. ``eval_tasks`` / ``eval_report``: lm-eval tasks on
local data and the comparison table; ``eval_settings``: tools/evaluate.py's flags.
``model_card``: the export's README.md (Hub metadata) and the evaluation recorded in it. The CLIs are tools/convert_to_hf.py and tools/evaluate.py.
"""
