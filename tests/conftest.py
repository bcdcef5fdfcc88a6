"""Shared fixtures: a fresh random generator per test (its seed printed on failure) and GPU gating."""

from __future__ import annotations

import numpy as np
import pytest

import quantplan as qp


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    seed = int(np.random.SeedSequence().entropy % (2**63))
    request.node.user_properties.append(("seed", seed))
    print(f"random seed: {seed}")
    return np.random.default_rng(seed)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--nvrtc-sweep",
        action="store_true",
        help="also compile every kernel instantiation with NVRTC (sm_80 and sm_90 cubins, fast-compile level; CI runs it)",
    )


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects: ``-m "not gpu"`` sees the marks added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # every test of a *_gpu.py file needs a GPU, marked or not
        if item.path.name.endswith("_gpu.py") and "gpu" not in item.keywords:
            item.add_marker(pytest.mark.gpu)
    if not config.getoption("--nvrtc-sweep"):
        sweep = pytest.mark.skip(reason="the full NVRTC sweep runs with --nvrtc-sweep (a sample compiles by default)")
        for item in items:
            if "nvrtc_sweep" in item.keywords:
                item.add_marker(sweep)
    if qp.cuda_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU visible (CuPy sees no device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
