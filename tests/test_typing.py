"""The public API's annotations: they resolve at run time, the package ships py.typed (PEP 561)
so that type checkers read them, and the Literal types are the runtime lists."""
import importlib.resources
import typing

import jax_selscan
from jax_selscan import primitives, selective_scan_primitives

PUBLIC_FUNCTIONS = ["linear_scan", "selective_scan", "selective_state_update", "selective_scan_ref",
                    "sharded_linear_scan", "sharded_selective_scan", "associative_scan"]


def test_py_typed_is_installed():
    assert importlib.resources.files("jax_selscan").joinpath("py.typed").is_file()


def test_annotations_resolve():
    for name in PUBLIC_FUNCTIONS:
        hints = typing.get_type_hints(getattr(jax_selscan, name))
        assert "return" in hints or name == "associative_scan", name


def test_literals_are_the_runtime_lists():
    assert typing.get_args(primitives.Algorithm) == jax_selscan.ALGORITHMS
    assert typing.get_args(selective_scan_primitives.Direction) == jax_selscan.DIRECTIONS
    hints = typing.get_type_hints(jax_selscan.linear_scan)
    assert hints["algorithm"] is primitives.Algorithm
    direction = typing.get_type_hints(jax_selscan.selective_scan)["direction"]
    assert direction is selective_scan_primitives.Direction
