"""The README's Python code blocks run as written, on the reference backend (CPU).

Each ```python block of README.md runs in its own interpreter with no GPU visible
(``CUDA_VISIBLE_DEVICES=""``), so the snippets a new user copies first are checked on the
backend every machine has. Blocks that import PyTorch are skipped when it is not installed;
blocks that start a process group run as a one-process torchrun would (rank 0 of 1, gloo).
The docs' quickstart page (README snippets included, then its own blocks in order) runs the same way.
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
