"""Hugging Face configuration of an exported fixed-code checkpoint: Llama's, plus the code.

Copied next to the weights (``trust_remote_code``), so it imports nothing from megatron_ext.
``fixed_code`` is :meth:`megatron_ext.codes.schemes.FixedCode.to_dict` of the trained model (see
docs/codes.md): ``scheme`` (binary, gf2, permuted, random), ``num_bits`` n, ``values`` (pm1,
01), ``scale``, ``A`` and ``b`` (gf2: n×n and n 0/1 lists, else null), ``tiling`` (repeat,
recode), ``table`` (permuted, random: the code input of each id, else null), ``recode_A`` and
``recode_b`` (recode: R = ⌈hidden/n⌉ maps, R×n×n and R×n, else null). Configs exported before
tilings and tables existed lack the last four keys: they mean repeat and null.
``code_projection``: the n-bit code is mapped to the width by the trained linear map
``model.embed_tokens.projection.weight`` (h x n) instead of tiled (repeat tiling only).
"""

from huggingface_hub.dataclasses import strict
from transformers import LlamaConfig

# megatron_ext.codes.schemes.SCHEMES, restated: this file travels with an export and imports nothing
# of megatron_ext (tests/integration/test_convert_to_hf.py holds the two equal).
SCHEMES = ("binary", "gf2", "permuted", "random")


@strict
class FixedCodeLlamaConfig(LlamaConfig):
    model_type = "fixedcode_llama"

    fixed_code: dict | None = None
    code_projection: bool = False

    def validate_architecture(self):
        super().validate_architecture()
        code = self.fixed_code
        keys = ("scheme", "num_bits", "values", "scale", "A", "b")
        if not isinstance(code, dict) or any(k not in code for k in keys):
            raise ValueError(f"config.json: fixed_code must be a dict with keys {keys}, "
                             f"got {code!r}")
        scheme, tiling = code["scheme"], code.get("tiling", "repeat")
        if (scheme not in SCHEMES or code["values"] not in ("pm1", "01")
                or tiling not in ("repeat", "recode")):
            raise ValueError(f"config.json: unknown fixed_code scheme {scheme!r}, values "
                             f"{code['values']!r} or tiling {tiling!r}")
        for keys, needed, what in ((("A", "b"), scheme == "gf2", "gf2"),
                                   (("table",), scheme in ("permuted", "random"),
                                    "permuted and random"),
                                   (("recode_A", "recode_b"), tiling == "recode", "recode")):
            if any((code.get(k) is None) == needed for k in keys):
                raise ValueError(f"config.json: fixed_code {' and '.join(keys)} are required "
                                 f"for {what}, and absent otherwise")
        n = code["num_bits"]
        if self.hidden_size < n:
            raise ValueError(f"config.json: hidden_size {self.hidden_size} is smaller than "
                             f"fixed_code num_bits {n}")
        if tiling == "recode" and len(code["recode_A"]) != -(-self.hidden_size // n):
            raise ValueError(f"config.json: fixed_code has {len(code['recode_A'])} recode "
                             f"maps; hidden_size {self.hidden_size} needs one per "
                             f"{n}-position block")
        if code.get("table") is not None and len(code["table"]) != self.vocab_size:
            raise ValueError(f"config.json: fixed_code table has {len(code['table'])} entries, "
                             f"vocab_size is {self.vocab_size}")
        if self.code_projection and tiling != "repeat":
            raise ValueError(f"config.json: code_projection maps the n-bit code in place of "
                             f"the tiling, so it needs the repeat tiling, not {tiling}")
        if self.tie_word_embeddings:
            raise ValueError("config.json: a fixed-code input has no table to tie lm_head to")
