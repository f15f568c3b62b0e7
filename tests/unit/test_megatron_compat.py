"""Each difference between the megatron-core releases fixedcode supports, asked of the installed
package (megatron_ext/runtime/megatron_compat.py), agrees with the release it appeared in: on
the 0.16.1 leg none is present, on the 0.19.x leg all are. And no module but the compat module
touches a name that moved."""

from __future__ import annotations

import re

import pytest
from packaging.version import Version

from conftest import REPO
from megatron_ext.runtime import megatron_compat
from megatron_ext.runtime.megatron_compat import DIFFERENCES, installed_release


def test_the_installed_release_is_in_the_supported_range():
    pin = re.search(r'"megatron-core>=([\d.]+),<([\d.]+)"',
                    (REPO / "pyproject.toml").read_text()).groups()
    assert Version(pin[0]) <= Version(installed_release()) < Version(pin[1])


@pytest.mark.parametrize("difference", DIFFERENCES, ids=lambda d: f"{d.since} {d.what}")
def test_each_difference_is_found_where_its_release_has_it(difference):
    assert difference.present() == (Version(installed_release()) >= Version(difference.since))


def test_the_mlp_submodules_are_found_in_every_release_and_replaced_in_place():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    fc1 = megatron_compat.mlp_submodules(spec).linear_fc1
    megatron_compat.mlp_submodules(spec).linear_fc2 = "replaced"
    assert megatron_compat.mlp_submodules(spec).linear_fc2 == "replaced"
    assert megatron_compat.mlp_submodules(spec).linear_fc1 is fc1


# Names that moved or went between the supported releases: only the compat module says them.
MOVED = ("tokenizers.text.utils", "tokenizers.utils.build_tokenizer", "as_mlp_submodule",
         "async_strategy", "load_common_state_dict", "RampupBatchsize",
         "tokenizer_hf_use_fast", "tokenizer_hf_no_use_fast")


def test_only_the_compat_module_touches_a_moved_name():
    sources = [p for folder in ("megatron_ext", "tools", "tests", "bench", "examples")
               for p in (REPO / folder).rglob("*.py")] + [REPO / "pretrain_fixedcode.py"]
    touching = sorted(f"{p.relative_to(REPO)}: {name}" for p in sources
                      for name in MOVED if name in p.read_text(encoding="utf-8")
                      and p.name not in ("megatron_compat.py", "test_megatron_compat.py"))
    assert touching == []
