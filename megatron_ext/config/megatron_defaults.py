"""The defaults of ours that differ from Megatron-LM core_v0.16.1's (its
``megatron/training/arguments.py``, with ``TransformerConfig`` and ``training_config.py``
where its parser takes them from): the paper's recipe, kept, and said once at start-up
(:func:`defaults_line`) for a user whose scripts rely on Megatron-LM's, each declared on
its flag's field (``megatron_lm=``). docs/training.md
tables them; a test checks the table and ours against the parser. No torch."""

from __future__ import annotations

from typing import Optional

from .model_config import ModelConfig
from .run_config import RunConfig, fields_where

# dest: (Megatron-LM's default, what it means), as each flag's field declares it
# (flag_fields.flag's megatron_lm); ours is the flag's declared default
MEGATRON_LM_DEFAULTS = {field.name: field.metadata["megatron_lm"]
                        for _, field in fields_where() if field.metadata["megatron_lm"]}
# dest: (ours, Megatron-LM's, what Megatron-LM's means)
DIFFERING_DEFAULTS = {dest: (RunConfig().record()[dest], *theirs)
                      for dest, theirs in MEGATRON_LM_DEFAULTS.items()}


def flag_text(dest: str, value) -> str:
    """``--swiglu``/``--no-swiglu`` for a switch, ``--lr 0.0003`` for a value."""
    flag = "--" + dest.replace("_", "-")
    if isinstance(value, bool):
        return flag if value else "--no-" + flag[2:]
    return f"{flag} {value}"


def defaults_in_force(config: RunConfig) -> list[str]:
    """Each differing default that ``config`` still holds: ``"--lr 0.0003 (Megatron-LM:
    required)"``."""
    flags = config.record()
    return [f"{flag_text(dest, ours)} (Megatron-LM: {meaning})"
            for dest, (ours, _, meaning) in DIFFERING_DEFAULTS.items()
            if flags[dest] == ours]


def defaults_line(config: RunConfig) -> Optional[str]:
    """The start-up log line of :func:`defaults_in_force`, or None when none is in force."""
    in_force = defaults_in_force(config)
    if not in_force:
        return None
    return "[fixedcode] defaults that differ from Megatron-LM's, in force: " + ", ".join(in_force)


def query_groups_line(model: ModelConfig) -> Optional[str]:
    """The start-up log line for ``--num-query-groups`` given without
    ``--group-query-attention``: grouped-query attention here, full multi-head attention in
    Megatron-LM (which reads the groups only under that flag); None otherwise."""
    if model.num_query_groups is None or model.group_query_attention \
            or model.num_query_groups == model.num_attention_heads:
        return None
    return (f"[fixedcode] --num-query-groups {model.num_query_groups} without "
            f"--group-query-attention: grouped-query attention with {model.num_query_groups} "
            f"groups (Megatron-LM would build full multi-head attention, reading the groups "
            f"only under --group-query-attention)")

