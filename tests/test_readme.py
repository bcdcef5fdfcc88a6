"""The README's Python code blocks run as written, on the reference backend (CPU).

Each ```python block of README.md runs in its own interpreter with no GPU visible
(``CUDA_VISIBLE_DEVICES=""``), so the snippets a new user copies first are checked on the
backend every machine has. Blocks that import PyTorch are skipped when it is not installed;
blocks that start a process group run as a one-process torchrun would (rank 0 of 1, gloo).
The docs' quickstart page (README snippets included, then its own blocks in order) runs the same way.
The README's shell blocks are checked for what a new user relies on: it opens with the two lines
that install and run the demo and the GPU-free tests, it has one install line per machine, and CI
runs its full test command.
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
DOCS_QUICKSTART = README.parent / "docs" / "quickstart.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
_HEADING = re.compile(r"^#+ (.+)$", re.MULTILINE)
_SNIPPET = re.compile(r'^--8<-- "README\.md:(\w+)"$', re.MULTILINE)
_BASH = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)
CI_SCRIPT = README.parent / ".ci" / "run"


def readme_section(name: str) -> str:
    """The README text between the docs' snippet markers ``[start:name]`` and ``[end:name]``."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"--8<-- [start:{name}]")
    return text[text.index("\n", start) + 1 : text.rindex("\n", 0, text.index(f"--8<-- [end:{name}]"))]


def python_blocks(text: str) -> list[tuple[str, str]]:
    """(id, code) of every ```python block, the id naming the section it sits in."""
    blocks = []
    for n, match in enumerate(_BLOCK.finditer(text)):
        headings = _HEADING.findall(text, 0, match.start())
        section = headings[-1] if headings else "top"
        blocks.append((f"{n}-{re.sub(r'[^a-z0-9]+', '-', section.lower()).strip('-')}", match.group(1)))
    return blocks


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_readme_has_python_blocks() -> None:
    assert len(BLOCKS) >= 3, "README.md lost its quickstart / PyTorch / ZeRO++ examples"


def run_block(code: str, tmp_path: Path) -> None:
    """Run ``code`` in a fresh interpreter on the reference backend; fail with its output."""
    if re.search(r"^import torch|^from torch", code, re.MULTILINE) and importlib.util.find_spec("torch") is None:
        pytest.skip("needs PyTorch (the torch extra)")
    root = str(README.parent)  # this checkout's quantplan, whatever is installed
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1", PYTHONPATH=path)
    if "init_process_group" in code:  # what torchrun sets for a one-process job
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    script = tmp_path / "block.py"
    script.write_text(code, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script)], env=env, cwd=root, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"block failed:\n{code}\n--- output ---\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("code", [code for _, code in BLOCKS], ids=[name for name, _ in BLOCKS])
def test_readme_block_runs(code: str, tmp_path: Path) -> None:
    run_block(code, tmp_path)


def test_docs_quickstart_runs(tmp_path: Path) -> None:
    if not DOCS_QUICKSTART.exists():  # a source distribution without the docs
        pytest.skip("docs/ is not part of this checkout")
    page = _SNIPPET.sub(lambda m: readme_section(m.group(1)), DOCS_QUICKSTART.read_text(encoding="utf-8"))
    blocks = _BLOCK.findall(page)
    assert len(blocks) >= 2, "docs/quickstart.md lost its examples"
    run_block("\n".join(blocks), tmp_path)


def _commands(script: str) -> list[str]:
    """The shell commands of ``script``: comment lines and trailing comments dropped, ``&&`` split."""
    commands = []
    for line in script.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line and not line.startswith("#"):
            commands += [part.strip() for part in line.split("&&")]
    return commands


def test_readme_opens_with_the_demo_and_the_tests_for_any_machine() -> None:
    """The first block: one line installs quantplan and runs the demo, one installs the test tools
    and runs the tests; no CUDA extra (a fresh machine may have no GPU) and no wall of GPU skips."""
    text = README.read_text(encoding="utf-8")
    first = _BASH.search(text)
    assert first is not None and first.start() < text.index("\n## "), "README.md must open with its set-up block"
    lines = [line for line in first.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(lines) == 2, lines
    demo, tests = lines
    assert "pip install" in demo and "examples/quickstart.py" in demo and "cuda" not in demo, demo
    assert "pip install" in tests and "pytest" in tests and "cuda" not in tests, tests
    assert '-m "not gpu"' in tests, "the CPU test line should leave the GPU tests out, not skip them one by one"


def test_readme_has_an_install_line_per_machine() -> None:
    commands = {c for block in _BASH.findall(README.read_text(encoding="utf-8")) for c in _commands(block)}
    for extra in ('".[test]"', '".[cuda12,test]"', '".[cuda13,test]"'):
        assert f"python -m pip install -e {extra}" in commands, f"no runnable install line for {extra}"
    assert "python -m pytest -q tests" in commands, "no full test command"


def test_ci_runs_the_readme_test_command() -> None:
    """CI runs the test command README.md opens with (the one a new user runs), and nothing else."""
    if not CI_SCRIPT.exists():  # a source distribution without CI
        pytest.skip(".ci/run is not part of this checkout")
    text = README.read_text(encoding="utf-8")
    first = _BASH.search(text)
    assert first is not None
    opening = [c for c in _commands(first.group(1)) if c.startswith("python -m pytest")]
    ci = _commands(CI_SCRIPT.read_text(encoding="utf-8"))
    runs = [c for c in ci if c.startswith("python -m pytest") and "--nvrtc-sweep" not in c]
    assert runs == opening == ['python -m pytest -q -m "not gpu" tests'], (runs, opening)
