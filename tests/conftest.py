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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if qp.cuda_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU visible (CuPy sees no device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
