"""CPU: the package keeps its layers (ARCHITECTURE.md), read from the source with ``ast``.

Layers, bottom to top: vocabulary -> machinery -> reference -> op modules -> front-ends. A module's
layer is its folder: ``quantplan/vocabulary/``, ``quantplan/runtime/`` (machinery),
``quantplan/reference/``, ``quantplan/ops/``; everything else (the top level, ``distributed/``,
``compat/``) is a front-end. A module may import its own layer or a lower one, never a higher one;
op modules never import each other (what two of them share moves down to machinery); the compiler
is a leaf over the vocabulary; the layer folders' ``__init__`` import nothing; no module of the
package imports a compatibility alias (the old top-level paths of public modules); and no chain of
imports comes back to where it started. Imports inside functions count: a lazy import is still a
dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "quantplan"

VOCABULARY, MACHINERY, REFERENCE, OPS, FRONTENDS = range(5)
LAYER_NAMES = ("vocabulary", "machinery", "reference", "op", "front-end")

#: layer folder (directly under ``quantplan/``) -> layer; any other module is a front-end.
FOLDERS: dict[str, int] = {"vocabulary": VOCABULARY, "runtime": MACHINERY, "reference": REFERENCE, "ops": OPS}

#: Marks a compatibility alias (written by ``tools/relayer.py --aliases``).
ALIAS_MARK = "# quantplan compatibility alias"

#: The compile layer is a leaf: it may import the vocabulary only.
LEAVES = {"runtime.compiler": {VOCABULARY}}

#: Most modules on one import chain (the module itself included; imports inside functions count).
#: The architecture issue's bar is 8; lower this constant as cuts land, never raise it.
MAX_IMPORT_DEPTH = 8


def module_names() -> list[str]:
    """Every module of the package, dotted and relative to it (``compat.deepspeed``, ``__init__``)."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts.pop()
        names.append(".".join(parts))
    return names


def layer_of(module: str) -> int:
    """A module's layer, from its folder: ``runtime._launch`` is machinery, ``pytorch`` a front-end."""
    return FOLDERS.get(module.split(".")[0], FRONTENDS)


def source_path(module: str) -> Path:
    base = PACKAGE.joinpath(*module.split("."))
    if module == "__init__":
        return PACKAGE / "__init__.py"
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def is_package(module: str) -> bool:
    return module == "__init__" or PACKAGE.joinpath(*module.split(".")).is_dir()


def resolve(target: str, known: set[str]) -> str:
    """``target`` (dotted, relative to the package) as a known module: the package itself is ``__init__``."""
    return target if target in known else ("__init__" if target == "" else target)


def imports_of(module: str, known: set[str]) -> list[tuple[str, int]]:
    """The package modules ``module`` imports (anywhere in its body), with the line of each import."""
    tree = ast.parse(source_path(module).read_text(), filename=str(source_path(module)))
    here = module.split(".") if is_package(module) and module != "__init__" else module.split(".")[:-1]
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "quantplan" or alias.name.startswith("quantplan."):
                    found.append((resolve(alias.name.partition(".")[2], known), node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module is None or not (node.module == "quantplan" or node.module.startswith("quantplan.")):
                    continue
                base = node.module.partition(".")[2]
            else:
                anchor = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                base = ".".join([*anchor, node.module] if node.module else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}" if base else alias.name
                found.append((resolve(sub if sub in known else base, known), node.lineno))
    first: dict[str, int] = {}
    for name, line in found:
        if name != module:
            first.setdefault(name, line)
    return sorted(first.items(), key=lambda item: item[1])


KNOWN = set(module_names())
GRAPH = {m: imports_of(m, KNOWN) for m in sorted(KNOWN)}


def is_alias(module: str) -> bool:
    return ALIAS_MARK in source_path(module).read_text()


ALIASES = sorted(m for m in KNOWN if is_alias(m))


def test_layer_folders_hold_their_modules() -> None:
    """Each layer folder is a package whose ``__init__`` imports nothing (it adds no import level);
    ``quantplan.reference`` is the affine reference itself, so its ``__init__`` is a module of the layer."""
    for folder in FOLDERS:
        assert folder in KNOWN and is_package(folder), f"quantplan/{folder}/ is not a package"
        assert any(m.startswith(folder + ".") for m in KNOWN), f"quantplan/{folder}/ holds no module"
        if folder != "reference":
            assert GRAPH[folder] == [], (
                f"quantplan/{folder}/__init__.py imports {GRAPH[folder]}: it must import nothing"
            )
    assert layer_of("runtime._launch") == MACHINERY and layer_of("pytorch") == FRONTENDS
    assert layer_of("distributed._steps") == FRONTENDS and layer_of("ops.deepspeed_format") == OPS


def test_aliases_are_thin_and_unused() -> None:
    """A compatibility alias (an old public path) imports the one module it names, and no module of
    the package imports an alias: inside the package every import names the module's own folder."""
    assert ALIASES, "no compatibility alias found (tools/relayer.py --aliases writes them)"
    for alias in ALIASES:
        targets = [t for t, _ in GRAPH[alias]]
        assert len(targets) == 1 and layer_of(targets[0]) < FRONTENDS, f"{alias} imports {targets}"
        assert targets[0].rpartition(".")[2] == alias or alias == "reference_block_scaled", (alias, targets)
    users = sorted((m, t) for m in KNOWN for t, _ in GRAPH[m] if t in ALIASES and m not in ALIASES)
    assert not users, f"modules importing a compatibility alias instead of the module: {users}"


@pytest.mark.parametrize("alias", ALIASES)
def test_an_alias_is_the_moved_module(alias: str) -> None:
    """``import quantplan.<old>`` gives the moved module itself (one module object, so a patch or an
    ``isinstance`` through either path sees the same thing), with its public names."""
    import importlib

    (target,) = [t for t, _ in GRAPH[alias]]
    old = importlib.import_module(f"quantplan.{alias}")
    assert old is importlib.import_module(f"quantplan.{target}")
    assert old.__name__ == f"quantplan.{target}"


def test_importing_an_old_path_keeps_the_package_names() -> None:
    """Importing every old path (in a fresh interpreter) leaves the package's public names as they
    were: ``quantplan.fake_quantize`` stays the one-liner, not the module of the same old name, and
    each other old name answers with its moved module; the alias table of ``quantplan/__init__.py``
    and the alias files agree."""
    import subprocess
    import sys

    code = (
        "import importlib, quantplan as qp\n"
        f"aliases = {sorted(ALIASES)!r}\n"
        "before = {n: getattr(qp, n) for n in qp.__all__}\n"
        "mods = [importlib.import_module('quantplan.' + a) for a in aliases]\n"
        "assert set(aliases) == set(qp._MOVED_PUBLIC), sorted(set(aliases) ^ set(qp._MOVED_PUBLIC))\n"
        "assert {n: getattr(qp, n) for n in qp.__all__} == before\n"
        "assert callable(qp.fake_quantize) and not isinstance(qp.fake_quantize, type(qp))\n"
        "for a, m in zip(aliases, mods):\n"
        "    assert a == 'fake_quantize' or getattr(qp, a) is m, a\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("module", sorted(KNOWN))
def test_no_import_runs_upward_or_sideways(module: str) -> None:
    mine = layer_of(module)
    assert mine is not None
    problems = []
    for target, line in GRAPH[module]:
        theirs = layer_of(target)
        where = f"quantplan/{source_path(module).relative_to(PACKAGE)}:{line} imports {target}"
        if theirs > mine:
            problems.append(
                f"{where}: {LAYER_NAMES[mine]} module must not import {LAYER_NAMES[theirs]} module (upward)"
            )
        elif mine == OPS and theirs == OPS and target != module:
            problems.append(f"{where}: op modules do not import each other; move the shared code down a layer")
        elif module in LEAVES and theirs not in LEAVES[module]:
            problems.append(f"{where}: {module} is a leaf over the vocabulary")
    assert not problems, "\n".join(problems)


def test_no_import_cycle() -> None:
    """Depth-first search over the import graph; the first cycle found is named in full."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target, _ in GRAPH.get(node, []):
            if target not in GRAPH:
                continue
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if state.get(target) is None:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(GRAPH):
        if start not in state:
            cycle = visit(start)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checker_sees_imports() -> None:
    """Guard against a checker that passes by reading nothing: known edges must be found."""
    assert ("vocabulary.types", 0) not in GRAPH["vocabulary.errors"]
    assert any(t == "vocabulary._kinds" for t, _ in GRAPH["vocabulary.types"])
    assert any(t in ("vocabulary.errors", "vocabulary.types") for t, _ in GRAPH["runtime.compiler"])
    assert any(layer_of(t) == OPS for t, _ in GRAPH["__init__"])
    assert any(t == "reference" for t, _ in GRAPH["ops.dynamic_range"])


def longest_import_chain() -> list[str]:
    """The longest chain ``a -> b -> ...`` of package imports (the graph has no cycle: checked above)."""
    best: dict[str, list[str]] = {}

    def chain(module: str) -> list[str]:
        if module not in best:
            tails = [chain(target) for target, _ in GRAPH[module] if target in GRAPH]
            best[module] = [module, *max(tails, key=len, default=[])]
        return best[module]

    return max((chain(m) for m in sorted(GRAPH)), key=len)


def test_import_depth() -> None:
    longest = longest_import_chain()
    assert len(longest) >= 3, "the depth check sees no chain: the graph is empty"
    assert len(longest) <= MAX_IMPORT_DEPTH, (
        f"the package is {len(longest)} import levels deep (at most {MAX_IMPORT_DEPTH}): "
        + " -> ".join(longest)
        + "; move what the importer uses down a module, or pass it in"
    )
