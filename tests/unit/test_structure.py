"""The project's structure, as the developers' guide states it: imports point one way (each
folder of the package imports only the folders below it in LAYERS; tools import the package), no
private name crosses a package, tools are command lines that import only the package and define only
parsing and printing, and the README stays a front door. Read from the source text (ast), nothing is
imported."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = REPO / "megatron_ext"
# The package's folders, lowest first: a folder imports only folders before it here.
LAYERS = ["runtime", "codes", "config", "checkpoint", "model", "datasets", "metrics", "train",
          "launch", "preprocess", "hf", "probes", "study"]


def part_of(path: Path) -> str:
    relative = path.relative_to(PACKAGE).parts
    return relative[0] if len(relative) > 1 else "root"


def imports(path: Path):
    """``(module, names)`` of every import in ``path`` (function-level ones too), relative
    imports resolved to ``megatron_ext...``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([module] if module else []))
            yield module, [a.name for a in node.names]


def folders_reached(module: str, names: list[str]) -> set[str]:
    """The folders of megatron_ext an import reaches."""
    parts = module.split(".")
    if parts[0] != "megatron_ext":
        return set()
    if len(parts) > 1:
        return {parts[1]} & set(LAYERS)
    return set(names) & set(LAYERS)


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_imports_point_one_way(path):
    part = part_of(path)
    reached = set().union(*(folders_reached(m, n) for m, n in imports(path))) - {part}
    below = set(LAYERS[:LAYERS.index(part)]) if part in LAYERS else set()
    assert reached <= below, f"{part} imports {sorted(reached - below)}"
    assert not any(m == "pretrain_fixedcode" or m.startswith("tools") for m, _ in imports(path))


def folder_imports() -> set[tuple[str, str]]:
    """``(A, B)`` for every folder A of the package that imports folder B."""
    return {(part_of(path), folder) for path in MODULES for module, names in imports(path)
            for folder in folders_reached(module, names) if folder != part_of(path)}


def transitive_reduction(edges: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The edges not implied by a path of others (the graph has no cycle)."""
    def reaches(start, target, without):
        stack, seen = [b for a, b in edges if a == start and (a, b) != without], set()
        while stack:
            node = stack.pop()
            if node == target:
                return True
            if node not in seen:
                seen.add(node)
                stack.extend(b for a, b in edges if a == node)
        return False
    return {(a, b) for a, b in edges if not reaches(a, b, (a, b))}


def test_the_architecture_diagram_is_the_code():
    """docs/architecture.md's Mermaid graph is the transitive reduction of the folders'
    imports: an import that changes it fails here until the diagram is redrawn."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"```mermaid\n(.*?)```", text, re.S).group(1)
    drawn = set(re.findall(r"^\s*(\w+) --> (\w+)\s*$", block, re.M))
    actual = transitive_reduction(folder_imports())
    assert drawn == actual, (f"missing from the diagram: {sorted(actual - drawn)}; "
                             f"drawn but not in the code: {sorted(drawn - actual)}")


def floors() -> dict[str, int]:
    """Each folder's floor: 1 for a folder that imports none of the others, else one above
    the highest folder it imports (the graph has no cycle: test_imports_point_one_way)."""
    edges, floor = folder_imports(), {}

    def of(folder: str) -> int:
        if folder not in floor:
            floor[folder] = 1 + max((of(b) for a, b in edges if a == folder), default=0)
        return floor[folder]
    for folder in LAYERS:
        of(folder)
    return floor


def test_the_house_has_eight_floors():
    """Seven floors of the package and the command lines above them (issue 48: the
    checkpoint code imported the model's provider for its code, and made a ninth): the
    checkpoint code shares the model's floor, on the floor above the configs."""
    floor = floors()
    assert max(floor.values()) + 1 == 8, floor  # + the entry points: pretrain_fixedcode, tools/
    assert floor["checkpoint"] == floor["model"] == floor["config"] + 1, floor


def module_table() -> dict[str, set[str]]:
    """docs/architecture.md's module table: ``{folder: the names in backquotes of its row's
    modules column}``."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)/` \| .*? \| (.*) \|$", text, re.M)
    return {folder: set(re.findall(r"`(\w+)`", modules)) for folder, modules in rows}


def test_the_architecture_table_names_every_module():
    """Each folder of the package has a row, and the row names each of its modules (those
    of a folder inside it too)."""
    table = module_table()
    assert set(table) == set(LAYERS), sorted(set(LAYERS) ^ set(table))
    for folder in LAYERS:
        modules = {p.stem for p in (PACKAGE / folder).rglob("*.py") if p.stem != "__init__"}
        assert modules <= table[folder], (folder, sorted(modules - table[folder]))


def test_the_readme_tour_names_every_folder():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    missing = [f for f in LAYERS if f"megatron_ext/{f}/" not in readme]
    assert not missing, missing


def test_every_folder_has_a_layer_and_the_root_holds_no_module():
    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert folders == set(LAYERS)
    assert [p.name for p in PACKAGE.glob("*.py")] == ["__init__.py"]


@pytest.mark.parametrize("path", MODULES + sorted((REPO / "tools").glob("*.py")),
                         ids=lambda p: str(p.relative_to(REPO)))
def test_no_private_name_crosses_a_package(path):
    own = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    for module, names in imports(path):
        if module.startswith("megatron_ext") and module.rsplit(".", 1)[0] != own \
                and module != own:
            assert not [n for n in names if n.startswith("_") and n != "__version__"], module


@pytest.mark.parametrize("path", sorted((REPO / "tools").glob("*.py")),
                         ids=lambda p: p.name)
def test_tools_are_command_lines_over_the_package(path):
    text = path.read_text(encoding="utf-8")
    assert "sys.path.insert" not in text
    assert not any(m.split(".")[0] in ("tools", "pretrain_fixedcode") for m, _ in imports(path))
    assert "def main(" in text and 'if __name__ == "__main__":' in text


@pytest.mark.parametrize("path", sorted((REPO / "tools").glob("*.py")),
                         ids=lambda p: p.name)
def test_tools_define_only_parsing_and_printing(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    defined = {node.name for node in tree.body
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    assert "main" in defined
    extra = defined - {"parse_args", "main"}
    assert not extra, f"{path.name} defines {sorted(extra)}: move them into megatron_ext/"


def test_tools_is_not_a_package():
    assert not (REPO / "tools" / "__init__.py").exists()


def test_the_readme_is_a_front_door():
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 300


@pytest.mark.parametrize("path", [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))],
                         ids=lambda p: p.name)
def test_docs_hold_no_paths_of_a_machine(path):
    found = re.findall(r"(?<![\w.])/(?:work|home|root|scratch|Users)/\S*",
                       path.read_text(encoding="utf-8"))
    assert not found, found


@pytest.mark.parametrize("init", sorted(PACKAGE.rglob("__init__.py")),
                         ids=lambda p: str(p.relative_to(REPO)))
def test_every_package_docstring_lists_its_modules(init):
    """Every module of the package is named in its docstring, and every name in double
    backquotes that looks like a module of it exists."""
    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
    modules = {p.stem for p in init.parent.glob("*.py") if p.stem != "__init__"}
    subpackages = {p.parent.name for p in init.parent.glob("*/__init__.py")}
    named = set(re.findall(r"``(\w+)``", doc))
    assert modules | subpackages <= named, sorted((modules | subpackages) - named)


# The folders that take the run's config (issue 48): the parsed flags stop at the entry points.
CONFIG_TAKERS = ("model", "train", "checkpoint", "metrics", "launch", "hf", "preprocess",
                 "datasets")


def functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


@pytest.mark.parametrize("path", [p for p in MODULES if part_of(p) in CONFIG_TAKERS],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_the_run_code_takes_configs_not_the_parsed_flags(path):
    """No signature there takes an ``argparse.Namespace`` (by annotation, or as ``args``), no
    Namespace is built there, and no config is built again from flags: the run's config is
    built once, at the entry point, and handed down."""
    text = path.read_text(encoding="utf-8")
    for function in functions(path):
        arguments = function.args.posonlyargs + function.args.args + function.args.kwonlyargs
        assert "args" not in [a.arg for a in arguments], f"{function.name} takes args"
        annotations = [ast.unparse(a.annotation) for a in arguments if a.annotation]
        assert not [a for a in annotations if "Namespace" in a], function.name
    assert "Namespace(" not in text
    assert not re.search(r"\b(from_flags|from_args|parse_args|parse_run_config)\(", text)


def test_only_the_named_handoff_builds_a_namespace():
    """The one place the package hands megatron-core an ``argparse.Namespace`` is
    ``runtime/megatron_compat.py:megatron_core_tokenizer`` (megatron-core's build_tokenizer
    reads one; megatron-core itself reads no global args): the Hugging Face reader too takes
    a checkpoint's saved flags as a config (``hf/megatron_checkpoint.py:SavedRun``)."""
    building = {p.relative_to(PACKAGE).as_posix() for p in MODULES
                if "argparse.Namespace(" in p.read_text(encoding="utf-8")}
    assert building == {"runtime/megatron_compat.py"}


def test_each_flag_is_declared_once_by_a_config_field():
    """pretrain_fixedcode.py's flags are declared by the configs' fields alone: no module of
    the package adds one by hand (``add_argument`` of a field's flag)."""
    from megatron_ext.config.flag_fields import flag_name
    from megatron_ext.config.run_config import CONCERNS
    flags = {flag_name(f.name) for concern in CONCERNS for f in concern.flag_fields()}
    by_hand = []
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("add_argument"):
                names = [a.value for a in node.args if isinstance(a, ast.Constant)]
                by_hand += [f"{path.relative_to(REPO)}: {n}" for n in names if n in flags]
    assert len(flags) > 140 and not by_hand, by_hand


TOOLS = sorted((REPO / "tools").glob("*.py"))
# The tools whose every flag is a config field's (issue 58): they add positional arguments only.
FIELD_TOOLS = ("plan", "submit", "probe", "evaluate", "check_data", "build_data_cache",
               "convert_to_hf", "check_checkpoint", "merge_datasets")


@functools.lru_cache(maxsize=None)
def field_flags() -> dict[str, list[str]]:
    """``{flag: ["module:Class.field", ...]}`` of every field of the package that declares a flag
    (a ``flag(...)`` default), read from the source: its ``names``, else ``--field-name``
    (``--no-field-name`` for a switch on by default, both with ``switch="both"``)."""
    flags = {}
    for path in MODULES:
        for cls in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(cls, ast.ClassDef):
                continue
            for node in cls.body:
                if not (isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Call)
                        and ast.unparse(node.value.func) == "flag"):
                    continue
                field, call = node.target.id, node.value
                keywords = {k.arg: k.value for k in call.keywords}
                if "names" in keywords:
                    names = list(ast.literal_eval(keywords["names"]))
                else:
                    plain = "--" + field.replace("_", "-")
                    on = (ast.unparse(node.annotation) == "bool" and call.args
                          and isinstance(call.args[0], ast.Constant) and call.args[0].value)
                    both = "switch" in keywords
                    names = ([plain, "--no-" + plain[2:]] if both
                             else ["--no-" + plain[2:]] if on else [plain])
                for name in names:
                    flags.setdefault(name, []).append(
                        f"{path.relative_to(PACKAGE)}:{cls.name}.{field}")
    return flags


def hand_added(path: Path) -> list[str]:
    """The option strings ``path`` passes to ``add_argument`` itself (string constants)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("add_argument"):
            found += [a.value for a in node.args if isinstance(a, ast.Constant)
                      and isinstance(a.value, str) and a.value.startswith("-")]
    return found


def test_the_field_flags_are_read_as_the_parser_makes_them():
    """The source reading above finds the flags ``add_flags`` makes of the training configs."""
    from megatron_ext.config.flag_fields import add_flags
    from megatron_ext.config.run_config import CONCERNS
    import argparse
    parser, flags = argparse.ArgumentParser(), field_flags()
    made = {s for c in CONCERNS for a in add_flags(parser, c) for s in a.option_strings}
    assert len(made) > 140 and made <= set(flags), sorted(made - set(flags))
    assert flags["--iteration"] == ["config/checkpoint_config.py:SavedIteration.iteration"]
    assert flags["--nodes"] == ["launch/slurm.py:Layout.nodes"]
    assert flags["--recipe"] == ["config/recipes.py:RecipeFile.recipe"]


# The tools not converted yet, whose flags of these names mean something of their own (a
# vocabulary to train, the simulations' seed, JSON on the screen) or are written otherwise
# (param_report's --arms, space-separated): each a later issue.
NOT_YET = {"calibrate.py": {"--seed", "--output-dir"}, "param_report.py": {"--json", "--arms"},
           "train_tokenizer.py": {"--input", "--json-keys", "--vocab-size", "--output-prefix"}}


@pytest.mark.parametrize("path", TOOLS, ids=lambda p: p.name)
def test_no_tool_writes_a_flag_that_a_field_declares(path):
    """A tool adds a flag the package's configs declare with ``add_flags``, never again by
    hand: one declaration of each flag (its name, type, default and help)."""
    flags = field_flags()
    again = {name: flags[name] for name in hand_added(path) if name in flags}
    assert set(again) == NOT_YET.get(path.name, set()), again


@pytest.mark.parametrize("name", FIELD_TOOLS)
def test_these_tools_declare_every_flag_by_a_field(name):
    """The tools of issue 58 call ``add_argument`` for their positional arguments only: each
    of their flags is a config field's."""
    assert (REPO / "tools" / f"{name}.py").exists()
    assert not hand_added(REPO / "tools" / f"{name}.py")


def test_a_flag_name_has_one_meaning_across_the_tools():
    """Each flag is declared by one field, but for the names below: the same word in tools
    that mean by it something of their own (a probe's window is not a training sequence),
    each read by one tool only. "Which saved iteration" is ``--iteration`` in every tool
    (training keeps Megatron-LM's ``--ckpt-step``)."""
    own_meanings = {
        "--data-path": "training's prefixes; probe.py's one held-out prefix",
        "--seed": "training's; a probe run's draws; lm-eval's",
        "--seq-length": "training's; probe.py's windows (default: the models')",
        "--batch-size": "a study's evaluation (and evaluate.py); probe.py's windows",
        "--dtype": "convert_to_hf.py's exported weights; evaluate.py's loaded models",
        "--device": "probe.py's (default cpu); evaluate.py's (default cuda if visible)",
        "--output": "convert_to_hf.py's export folder (new or empty); probe.py's report folder",
        "--input": "preprocess_data.py's corpus files; merge_datasets.py's datasets",
        "--output-prefix": "preprocess_data.py's (a _{key}_document suffix follows); "
                           "merge_datasets.py's (the dataset's own path)",
    }
    twice = {name: where for name, where in field_flags().items() if len(where) > 1}
    assert set(twice) == set(own_meanings), twice
    for path in TOOLS:
        assert "--ckpt-step" not in hand_added(path), path.name
