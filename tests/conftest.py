"""Test-wide settings: float64 on, so every case can be checked against a float64 reference."""
import os

import jax

jax.config.update("jax_enable_x64", True)

# .ci/run sets this so that a build that silently lost its CPU kernel fails the suite.
REQUIRE_CPU_KERNEL = os.environ.get("JAX_SELSCAN_REQUIRE_CPU_KERNEL") == "1"
