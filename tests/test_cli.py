"""CPU: ``python -m quantplan`` as a new user meets it: one-line errors naming the fix, Ctrl-C that
stops ``precompile`` and its compiler processes, an ``info`` whose install advice works from a checkout.

The precompile tests replace the NVRTC compile by a slow stand-in (a module written for the test,
importable by the worker processes), so they need no CuPy and take seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Runs ``python -m quantplan`` with CuPy made unimportable (what a CPU-only install has).
_NO_CUPY = textwrap.dedent(
    """
    import sys

    class _NoCupy:
        def find_spec(self, name, path=None, target=None):
            if name == "cupy" or name.startswith("cupy."):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, _NoCupy())
    from quantplan.__main__ import main

    sys.exit(main(sys.argv[1:]))
    """
)

#: A compile unit that announces its process and then takes a minute (NVRTC stand-in).
_SLOW_UNIT = textwrap.dedent(
    """
    import os
    import time
    from pathlib import Path

    def slow_unit(job):
        Path(os.environ["QP_TEST_MARKS"], f"started-{os.getpid()}").touch()
        time.sleep(60)
        return job[0]
    """
)

_SLOW_MAIN = textwrap.dedent(
    """
    import signal
    import sys

    import quantplan.runtime._precompile as pre
    import slow_unit

    # A runner that starts the tests as a background job of a non-interactive shell hands them
    # SIGINT ignored, and Python then installs no KeyboardInterrupt handler: restore it, as a
    # terminal's Ctrl-C would find it.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    pre.check_nvrtc = lambda: None
    pre._compile_unit_job = slow_unit.slow_unit
    from quantplan.__main__ import main

    sys.exit(main(sys.argv[1:]))
    """
)


def _env(tmp_path: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")


def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return True


def test_precompile_without_cupy_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    script = _script(tmp_path, "no_cupy.py", _NO_CUPY)
    proc = subprocess.run(
        [sys.executable, str(script), "precompile", "sm_90", "--jobs", "1"],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 1, output
    assert "Traceback" not in output, output
    lines = output.splitlines()
    assert len(lines) == 1, output
    assert "CuPy" in lines[0] and '".[cuda13]"' in lines[0] and '".[cuda12]"' in lines[0], lines[0]


def test_info_without_cupy_gives_install_advice_that_works_from_a_checkout(tmp_path: Path) -> None:
    script = _script(tmp_path, "no_cupy.py", _NO_CUPY)
    proc = subprocess.run(
        [sys.executable, str(script), "info"], env=_env(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("cupy:"))
    assert "pip install 'quantplan[" not in line, line  # quantplan is not on the package index
    assert 'pip install -e ".[cuda13]"' in line, line


def test_precompile_help_states_its_duration_and_ctrl_c() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "quantplan", "precompile", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    text = " ".join(proc.stdout.split())
    assert "minutes per architecture" in text and "Ctrl-C" in text, text


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_stops_precompile_and_its_workers(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    _script(tmp_path, "slow_unit.py", _SLOW_UNIT)
    script = _script(tmp_path, "slow_main.py", _SLOW_MAIN)
    env = dict(_env(tmp_path), QP_TEST_MARKS=str(marks))
    proc = subprocess.Popen(
        [sys.executable, str(script), "precompile", "sm_90", "--jobs", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while len(list(marks.iterdir())) < 2:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the workers did not start within 60 s"
            time.sleep(0.05)
        workers = [int(p.name.split("-")[1]) for p in marks.iterdir()]
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)  # what Ctrl-C delivers to the parent
        out, err = proc.communicate(timeout=55)  # a unit takes 60 s: waiting for one would time out
        elapsed = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, f"exit status {proc.returncode}\n{out}{err}"
    # Generous for a loaded CI machine (the NVRTC sweep runs beside the tests there), and still well
    # below the 60 s a unit takes.
    assert elapsed < 40, f"took {elapsed:.1f} s to stop (a unit takes 60 s: the workers were waited for)"
    assert "Traceback" not in err, err
    assert "interrupted" in err, err
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in workers if _alive(pid)], "compiler processes still running after Ctrl-C"
    assert len(list(marks.iterdir())) == 2, "new units started after Ctrl-C"
