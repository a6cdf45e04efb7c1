"""Test-wide settings: float64 on, so every case can be checked against a float64 reference."""
import os

import jax
import pytest

jax.config.update("jax_enable_x64", True)

# .ci/run sets this so that a build that silently lost its CPU kernel fails the suite.
REQUIRE_CPU_KERNEL = os.environ.get("JAX_SELSCAN_REQUIRE_CPU_KERNEL") == "1"


@pytest.fixture
def cpu_default_device():
    """The test's arrays, jitted calls and lowerings on the CPU whatever the default backend, so
    that the CPU-kernel tests test the CPU kernels on a GPU machine too (used by those modules'
    pytestmark)."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield
