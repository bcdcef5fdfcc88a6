"""Move quantplan's modules into the folders of their layers and rewrite every import to match.

Run from the repository root (``python tools/relayer.py``; ``--dry-run`` prints what it would do).
The move is a table, :data:`MOVES` (old module -> new module, dotted, relative to ``quantplan``).
The script

1. checks that every module of the package is either in the table, already in a layer folder, or a
   front-end kept at the top level (:data:`FRONT_ENDS`); any other module (a new one written
   beside the old layout) stops the run before anything changes, with the table line to add;
2. rewrites, in the package, ``tests/``, ``benchmarks/``, ``examples/``, ``tools/`` and the
   Markdown of the repository (``docs/``, README, ARCHITECTURE, CHANGELOG):

   * every import statement naming a moved module (``from quantplan._tuning import TUNING``,
     ``from quantplan import reference_block_scaled as rb``, package-relative imports such as
     ``from ._affine import ...``, which become absolute), keeping the local names it binds;
   * every dotted path ``quantplan.<old>`` (``import quantplan.x as y``, ``patch("quantplan.x.f")``,
     ``::: quantplan.x`` in the docs) and every file path ``quantplan/<old>.py``;

3. ``git mv``-s each module to its new place and creates the layer folders' ``__init__.py`` (a
   docstring, no import);
4. runs ``ruff check --select I --fix`` and ``ruff format`` on the files it changed (import order).

``--aliases``, run after the move is committed (so that git records each move as a rename),
writes one compatibility alias at the old top-level path of each public module (:data:`ALIASES`).

Replay: ``python tools/relayer.py && git add -A && git commit -m "..."``, then
``python tools/relayer.py --aliases && git add -A && git commit -m "..."``.
It is deterministic and idempotent: on a tree already moved it finds nothing to do.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "quantplan"

#: The layer folders, bottom to top below the front-ends (which stay at the top level), with the
#: docstring of each folder's ``__init__.py``.
FOLDERS: dict[str, str] = {
    "vocabulary": "Layer 1, the vocabulary: enums, scopes, errors, the dtype and format tables, Philox.",
    "runtime": (
        "Layer 2, the machinery two op modules share: devices, operands, layouts, kernel names and\n"
        "tuning, the compile layer, launches, the fast path and the ``Plan`` base."
    ),
    "reference": "",  # the package is the affine reference itself (moved from reference.py)
    "ops": "Layer 4, the op modules: the descriptor, Args and plan of one op family each.",
}

#: old module -> new module, dotted, relative to ``quantplan``. A new module: add its line here.
MOVES: dict[str, str] = {
    # 1 vocabulary
    "_kinds": "vocabulary._kinds",
    "types": "vocabulary.types",
    "errors": "vocabulary.errors",
    "elements": "vocabulary.elements",
    "formats": "vocabulary.formats",
    "philox": "vocabulary.philox",
    "_nvrtc_env": "vocabulary._nvrtc_env",
    "_version": "vocabulary._version",
    # 2 machinery
    "compiler": "runtime.compiler",
    "_kernel_names": "runtime._kernel_names",
    "_families": "runtime._families",
    "_tuning": "runtime._tuning",
    "_precompile": "runtime._precompile",
    "_device": "runtime._device",
    "_operand": "runtime._operand",
    "_operands": "runtime._operands",
    "_layout": "runtime._layout",
    "_segment_geometry": "runtime._segment_geometry",
    "_segments": "runtime._segments",
    "_launch": "runtime._launch",
    "_fast_check": "runtime._fast_check",
    "workspace": "runtime.workspace",
    "_plan": "runtime._plan",
    "_problems": "runtime._problems",
    "_affine": "runtime._affine",
    "_fake_rows": "runtime._fake_rows",
    "_qgz_launch": "runtime._qgz_launch",
    "_block_scaled_codes": "runtime._block_scaled_codes",
    "_block_scaled_kernels": "runtime._block_scaled_kernels",
    "_block_scaled_tile_kernels": "runtime._block_scaled_tile_kernels",
    "_selection": "runtime._selection",
    # 3 reference (the package quantplan.reference is the affine reference: reference.py moves into it)
    "reference": "reference",
    "reference_block_scaled": "reference.block_scaled",
    "compat._deepspeed_reference": "reference.deepspeed_format",
    # 4 op modules
    "static_quantize": "ops.static_quantize",
    "quantize_backward": "ops.quantize_backward",
    "dynamic_range": "ops.dynamic_range",
    "fake_quantize": "ops.fake_quantize",
    "dynamic_fake_quantize": "ops.dynamic_fake_quantize",
    "swizzled_quantize": "ops.swizzled_quantize",
    "dequant_reduce": "ops.dequant_reduce",
    "block_scaled": "ops.block_scaled",
    "compat._deepspeed_plans": "ops.deepspeed_format",
}

#: module -> the module it merges into (dotted): its imports join the target's, its body follows the
#: target's imports, and every import of it names the target. A chain of front-end modules one
#: level shorter (the collective classes live in the module users import).
MERGES: dict[str, str] = {
    "distributed._collectives": "distributed",
}

#: Every rename the rewriting applies: the moves and the merges.
RENAMES: dict[str, str] = {**MOVES, **MERGES}

#: 5 front-ends: they stay where users import them (the top level, ``distributed/``, ``compat/``).
FRONT_ENDS = {
    "__init__",
    "__main__",
    "_frontend",
    "functional",
    "_block_functional",
    "_torch_library",
    "_torch_ops",
    "pytorch",
    "distributed",
    "distributed._comm",
    "distributed._steps",
    "distributed._collectives",
    "compat",
    "compat.deepspeed",
    "compat._arrays",
}

#: Public modules whose old top-level path stays importable, as a thin alias of the moved module.
ALIASES = [
    "types",
    "errors",
    "elements",
    "formats",
    "philox",
    "workspace",
    "compiler",
    "reference_block_scaled",
    "static_quantize",
    "quantize_backward",
    "dynamic_range",
    "fake_quantize",
    "dynamic_fake_quantize",
    "swizzled_quantize",
    "dequant_reduce",
    "block_scaled",
]

ALIAS_MARK = "# quantplan compatibility alias (tools/relayer.py)"

#: What gets its imports and dotted paths rewritten.
PY_DIRS = ["quantplan", "tests", "benchmarks", "examples", "docs", "tools"]
#: CHANGELOG.md is history: it keeps the paths of its time.
TEXT_GLOBS = [
    "README.md",
    "ARCHITECTURE.md",
    "docs/**/*.md",
    "examples/*.ipynb",
    ".ci/*",
    "pyproject.toml",
    "mkdocs.yml",
    "kernels/*.cu",
    "kernels/*.cuh",
]


def module_of(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def path_of(module: str, package: bool) -> Path:
    base = PACKAGE.joinpath(*module.split("."))
    return base / "__init__.py" if package else base.with_suffix(".py")


def is_alias(path: Path) -> bool:
    return path.is_file() and ALIAS_MARK in path.read_text()


def package_modules() -> list[str]:
    return sorted(module_of(p) for p in PACKAGE.rglob("*.py") if not is_alias(p))


def unknown_modules() -> list[str]:
    """Modules neither in the table, nor in a layer folder, nor a front-end: the table needs a line."""
    moved_to = set(MOVES.values())
    out = []
    for module in package_modules():
        top = module.split(".")[0]
        if module in MOVES or module in moved_to or module in FRONT_ENDS:
            continue
        if top in FOLDERS and module != top:
            continue  # already in a layer folder
        if top in FOLDERS:
            continue  # a layer folder's __init__
        out.append(module)
    return out


# --- rewriting ---------------------------------------------------------------------------------

#: Longest first, so ``reference_block_scaled`` wins over ``reference``.
_OLD = sorted((k for k, v in RENAMES.items() if k != v), key=len, reverse=True)
_DOTTED = re.compile(r"(?<![\w.])quantplan\.(" + "|".join(re.escape(k) for k in _OLD) + r")(?![\w])(?!\.default\b)")
_SLASHED = re.compile(r"(?<![\w./])quantplan/(" + "|".join(re.escape(k.replace(".", "/")) for k in _OLD) + r")\.py\b")


def new_module(module: str) -> str:
    """``module`` (dotted, relative to quantplan; may name an attribute path) after the move."""
    for old in _OLD:
        if module == old or module.startswith(old + "."):
            return RENAMES[old] + module[len(old) :]
    return module


def top_level_names() -> set[str]:
    """The names ``quantplan/__init__.py`` exports: ``quantplan.fake_quantize`` is a function, not the module."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return {e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)}
    return set()


TOP_NAMES = top_level_names()


def _dotted(m: re.Match[str]) -> str:
    old = m.group(1)
    if old in TOP_NAMES and not m.string.startswith(".", m.end()):
        return m.group(0)  # the exported function of that name
    return "quantplan." + RENAMES[old]


def _file_of(module: str) -> str:
    """``quantplan/...`` path of a module after the move (a package's ``__init__.py`` for a package)."""
    if module in FOLDERS or module in ("distributed", "compat"):
        return module + "/__init__.py"
    return module.replace(".", "/") + ".py"


def rewrite_dotted(text: str) -> str:
    text = _DOTTED.sub(_dotted, text)
    return _SLASHED.sub(lambda m: "quantplan/" + _file_of(RENAMES[m.group(1).replace("/", ".")]), text)


def _known_module(dotted: str, modules: set[str]) -> bool:
    return dotted in modules or dotted in RENAMES or dotted in RENAMES.values()


def _split_import(base: str, names: list[tuple[str, str | None]], modules: set[str]) -> list[tuple[str, list[str]]]:
    """``from quantplan.<base> import names`` after the move: [(new absolute base, ["x", "y as z"])]."""
    groups: dict[str, list[str]] = {}
    for name, asname in names:
        full = f"{base}.{name}" if base else name
        if name != "*" and _known_module(full, modules) and not (base == "" and name in TOP_NAMES):
            target = new_module(full)
            parent, _, leaf = target.rpartition(".")
            local = asname or name
            entry = leaf if local == leaf else f"{leaf} as {local}"
            key = parent
        else:
            key = new_module(base)
            entry = name if asname is None else f"{name} as {asname}"
        groups.setdefault(key, []).append(entry)
    return [("quantplan" + (f".{k}" if k else ""), v) for k, v in groups.items()]


def rewrite_python(path: Path, source: str, modules: set[str]) -> str:
    """Import statements first (relative ones become absolute), then dotted paths."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return rewrite_dotted(source)
    lines = source.splitlines(keepends=True)
    here: list[str] | None = None
    if path.is_relative_to(PACKAGE):
        module = module_of(path)
        is_pkg = path.name == "__init__.py"
        here = module.split(".") if is_pkg and module != "__init__" else module.split(".")[:-1]
        if module == "__init__":
            here = []
    edits: list[tuple[int, int, str]] = []  # (first line, last line, replacement), 0-based
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            if here is None:
                continue
            anchor = here[: len(here) - (node.level - 1)]
            base = ".".join([*anchor, node.module] if node.module else anchor)
        elif node.module == "quantplan" or (node.module or "").startswith("quantplan."):
            base = node.module.partition(".")[2] if node.module else ""
        else:
            continue
        names = [(a.name, a.asname) for a in node.names]
        groups = _split_import(base, names, modules)
        old_base = "quantplan" + (f".{base}" if base else "")
        first, last = node.lineno - 1, node.end_lineno - 1 if node.end_lineno else node.lineno - 1
        head = re.compile(r"from\s+[\w.]+\s+import\b")
        original = "".join(lines[first : last + 1])
        if len(groups) == 1 and [e for e in groups[0][1]] == [n if a is None else f"{n} as {a}" for n, a in names]:
            if groups[0][0] == old_base and not node.level:
                continue
            replaced = head.sub(f"from {groups[0][0]} import", original, count=1)
            edits.append((first, last, replaced))
            continue
        indent = lines[first][: len(lines[first]) - len(lines[first].lstrip())]
        comment = lines[first].rstrip("\n").partition("#")[2] if first == last else ""
        tail = f"  #{comment}" if comment else ""
        text = "".join(f"{indent}from {b} import {', '.join(v)}{tail}\n" for b, v in groups)
        edits.append((first, last, text))
    for first, last, text in sorted(edits, reverse=True):
        lines[first : last + 1] = [text]
    # What is left are imports inside strings; the statements above are already in their new form.
    text = _FROM_INLINE.sub(lambda m: _rewrite_from(m.group("mod"), m.group("names"), modules, "; "), "".join(lines))
    return rewrite_dotted(text)


_FROM_LINE = re.compile(r"^(?P<indent>[ \t]*)from (?P<mod>quantplan(?:\.[\w.]+)?) import (?P<names>[\w ,]+)$", re.M)
#: ``from quantplan... import a, b as c`` inside a string (code run by a test in a subprocess).
_FROM_INLINE = re.compile(
    r"(?<![\w.])from (?P<mod>quantplan(?:\.[\w.]+)?) import "
    r"(?P<names>\w+(?: as \w+)?(?:, \w+(?: as \w+)?)*)(?![\w(])"
)


def _rewrite_from(mod: str, names_text: str, modules: set[str], sep: str, indent: str = "") -> str:
    base = mod.partition(".")[2]
    names = []
    for part in names_text.split(","):
        name, _, asname = part.strip().partition(" as ")
        if name:
            names.append((name.strip(), asname.strip() or None))
    groups = _split_import(base, names, modules)
    return sep.join(f"{indent}from {b} import {', '.join(v)}" for b, v in groups)


#: Markdown between these two lines keeps its text (prose that names the old paths on purpose).
KEEP_START, KEEP_END = "<!-- relayer: keep -->", "<!-- relayer: end -->"


def rewrite_text(source: str, modules: set[str]) -> str:
    """Markdown, notebooks, CI scripts: one-line ``from quantplan... import`` lines, then dotted paths;
    text between :data:`KEEP_START` and :data:`KEEP_END` lines stays as it is."""
    if KEEP_START in source:
        head, _, rest = source.partition(KEEP_START)
        kept, end, tail = rest.partition(KEEP_END)
        return rewrite_text(head, modules) + KEEP_START + kept + end + rewrite_text(tail, modules)

    def one(m: re.Match[str]) -> str:
        return _rewrite_from(m.group("mod"), m.group("names"), modules, "\n", m.group("indent"))

    return rewrite_dotted(_FROM_LINE.sub(one, source))


def rewrite_notebook(source: str, modules: set[str]) -> str:
    nb = json.loads(source)
    changed = False
    for cell in nb.get("cells", []):
        text = "".join(cell.get("source", []))
        new = rewrite_text(text, modules)
        if new != text:
            cell["source"] = new.splitlines(keepends=True)
            changed = True
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n" if changed else source


# --- moving ------------------------------------------------------------------------------------


def git(*args: str, dry: bool) -> None:
    print("git", *args)
    if not dry:
        subprocess.run(["git", *args], cwd=ROOT, check=True)


def move(src: Path, dst: Path, dry: bool) -> None:
    """``git mv``, or a plain rename for a file git does not track yet."""
    tracked = subprocess.run(
        ["git", "ls-files", "--error-unmatch", str(src.relative_to(ROOT))], cwd=ROOT, capture_output=True
    )
    if not dry:
        dst.parent.mkdir(exist_ok=True)
    if tracked.returncode == 0:
        git("mv", str(src.relative_to(ROOT)), str(dst.relative_to(ROOT)), dry=dry)
    else:
        print("mv (untracked)", src.relative_to(ROOT), dst.relative_to(ROOT))
        if not dry:
            src.rename(dst)


def alias_source(old: str, new: str) -> str:
    return (
        f'"""Compatibility alias of :mod:`quantplan.{new}` (the module moved to its layer\'s folder; see\n'
        f'ARCHITECTURE.md, "Folders"). New code imports ``quantplan.{new}``."""\n\n'
        f"{ALIAS_MARK}\n"
        "import sys\n\n"
        f"from quantplan.{new} import *  # noqa: F403\n\n"
        f'sys.modules[__name__] = sys.modules["quantplan.{new}"]  # the same module object\n'
    )


def _module_path(module: str) -> Path:
    package = path_of(module, True)
    return package if package.exists() else path_of(module, False)


def merge(source_module: str, target_module: str, dry: bool) -> int:
    """Append ``source_module`` to ``target_module`` (imports already rewritten to name the target)."""
    src, dst = _module_path(source_module), _module_path(target_module)
    if not src.exists():
        return 0
    source, target = src.read_text(), dst.read_text()
    s_tree, t_tree = ast.parse(source), ast.parse(target)
    s_lines, t_lines = source.splitlines(keepends=True), target.splitlines(keepends=True)
    imports = [n for n in s_tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    if not imports:
        print(f"{src.relative_to(ROOT)} has no import block to merge", file=sys.stderr)
        return 1
    head = "".join(
        "".join(s_lines[n.lineno - 1 : n.end_lineno])
        for n in imports
        if not (isinstance(n, ast.ImportFrom) and n.module == "__future__")
    )
    body = "".join(s_lines[imports[-1].end_lineno :])
    own = "quantplan." + target_module
    drop = [
        n
        for n in t_tree.body
        if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module == own  # the target importing itself
    ]
    t_imports = [n for n in t_tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    at = max(n.end_lineno or n.lineno for n in t_imports)
    out = t_lines[:at] + [head] + ["\n\n"] + [body.strip("\n") + "\n\n\n"] + t_lines[at:]
    for n in sorted(drop, key=lambda n: n.lineno, reverse=True):
        del out[n.lineno - 1 : n.end_lineno]
    print("merge", src.relative_to(ROOT), "into", dst.relative_to(ROOT))
    if not dry:
        dst.write_text("".join(out))
        git("rm", "-q", "-f", str(src.relative_to(ROOT)), dry=dry)
    return 0


def write_aliases(dry: bool) -> int:
    for old in ALIASES:
        new = MOVES[old]
        src = path_of(old, False)
        if not path_of(new, False).exists():
            print(f"{old} has not moved yet: run tools/relayer.py without --aliases first", file=sys.stderr)
            return 1
        if src.exists() and not is_alias(src):
            print(f"{src.relative_to(ROOT)} is a module, not an alias: merge it by hand", file=sys.stderr)
            return 1
        if not src.exists() or src.read_text() != alias_source(old, new):
            print("alias", src.relative_to(ROOT), "->", f"quantplan.{new}")
            if not dry:
                src.write_text(alias_source(old, new))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the moves and changed files only")
    parser.add_argument("--aliases", action="store_true", help="write the compatibility aliases (after the move)")
    parser.add_argument("--no-format", action="store_true", help="skip ruff (import order, formatting)")
    args = parser.parse_args()
    dry = args.dry_run

    if args.aliases:
        return write_aliases(dry)

    unknown = unknown_modules()
    if unknown:
        for module in unknown:
            print(f"unknown module quantplan/{module.replace('.', '/')}.py: add its line to MOVES in tools/relayer.py,")
            print(f'    e.g. "{module}": "runtime.{module}",  (or FRONT_ENDS if it is a front-end)')
        return 2

    modules = set(package_modules())
    changed: list[Path] = []
    files: set[Path] = set()
    for folder in PY_DIRS:
        files.update(p for p in (ROOT / folder).rglob("*.py") if ".venv" not in p.parts)
    for pattern in TEXT_GLOBS:
        files.update(p for p in ROOT.glob(pattern) if p.is_file())
    for path in sorted(files):
        if path == Path(__file__).resolve() or is_alias(path):
            continue
        source = path.read_text()
        if path.suffix == ".py":
            new = rewrite_python(path, source, modules)
        elif path.suffix == ".ipynb":
            new = rewrite_notebook(source, modules)
        else:
            new = rewrite_text(source, modules)
        if new != source:
            changed.append(path)
            print("rewrote", path.relative_to(ROOT))
            if not dry:
                path.write_text(new)

    for source_module, target_module in MERGES.items():
        if merge(source_module, target_module, dry) != 0:
            return 1
    for folder, doc in FOLDERS.items():
        init = PACKAGE / folder / "__init__.py"
        if doc and not init.exists():
            print("create", init.relative_to(ROOT))
            if not dry:
                init.parent.mkdir(exist_ok=True)
                init.write_text(f'"""{doc}\n\nThis ``__init__`` imports nothing: import the modules themselves."""\n')
                subprocess.run(["git", "add", str(init)], cwd=ROOT, check=True)
    for old, new in MOVES.items():
        if old == new:
            is_pkg_new = new in FOLDERS
            src = path_of(old, False)
            dst = path_of(new, True)
            if src.exists() and not dst.exists():  # reference.py -> reference/__init__.py
                move(src, dst, dry)
            assert is_pkg_new or dst.exists() or dry
            continue
        src = path_of(old, False)
        dst = path_of(new, False)
        if not src.exists() or is_alias(src):
            continue
        if dst.exists():
            print(
                f"both {src.relative_to(ROOT)} and {dst.relative_to(ROOT)} exist: merge them by hand", file=sys.stderr
            )
            return 1
        move(src, dst, dry)
    if not dry and not args.no_format:
        ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
        py = sorted(
            {str(p) for p in PACKAGE.rglob("*.py")} | {str(p) for p in changed if p.suffix == ".py" and p.exists()}
        )
        if Path(ruff).exists():
            subprocess.run([ruff, "check", "-q", "--select", "I,F811", "--fix", *py], cwd=ROOT)
            subprocess.run([ruff, "format", "-q", *py], cwd=ROOT)
        else:
            print("ruff not found: run `ruff check --select I --fix` and `ruff format` yourself")
    return 0


if __name__ == "__main__":
    sys.exit(main())
