"""Hugging Face configuration of an exported binary/gf2 checkpoint: Llama's, plus the code.

Copied next to the weights (``trust_remote_code``), so it imports nothing from megatron_ext.
``fixed_code`` is :meth:`megatron_ext.codes.FixedCode.to_dict` of the trained model:
``{"scheme": "binary"|"gf2", "num_bits": n, "values": "pm1"|"01", "scale": s, "A": n×n 0/1
lists or null, "b": n 0/1 list or null}``.
"""

from huggingface_hub.dataclasses import strict
from transformers import LlamaConfig


@strict
class FixedCodeLlamaConfig(LlamaConfig):
    model_type = "fixedcode_llama"

    fixed_code: dict | None = None

    def validate_architecture(self):
        super().validate_architecture()
        code = self.fixed_code
        keys = ("scheme", "num_bits", "values", "scale", "A", "b")
        if not isinstance(code, dict) or any(k not in code for k in keys):
            raise ValueError(f"config.json: fixed_code must be a dict with keys {keys}, "
                             f"got {code!r}")
        if code["scheme"] not in ("binary", "gf2") or code["values"] not in ("pm1", "01"):
            raise ValueError(f"config.json: unknown fixed_code scheme {code['scheme']!r} or "
                             f"values {code['values']!r}")
        binary = code["scheme"] == "binary"
        if binary != (code["A"] is None) or binary != (code["b"] is None):
            raise ValueError("config.json: fixed_code A and b are required for gf2, and absent "
                             "for binary")
        if self.hidden_size % code["num_bits"]:
            raise ValueError(f"config.json: hidden_size {self.hidden_size} is not a multiple of "
                             f"fixed_code num_bits {code['num_bits']}")
        if self.tie_word_embeddings:
            raise ValueError("config.json: a fixed-code input has no table to tie lm_head to")
