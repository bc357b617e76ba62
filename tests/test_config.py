"""``gnnact.Config`` validates every field at construction, naming the field and the value."""

from __future__ import annotations

import dataclasses
import re

import pytest

import gnnact
from gnnact import Config

# (field, bad value, error, message): each field with a value of the wrong type and, where the
# type has a range, one outside it.
BAD = [
    ("bits", "2", TypeError, "Config.bits must be an int, got '2' (str)"),
    ("bits", 2.0, TypeError, "Config.bits must be an int, got 2.0 (float)"),
    ("bits", True, TypeError, "Config.bits must be an int, got True (bool)"),
    ("bits", 9, ValueError, "Config.bits must be one of (1, 2, 3, 4, 5, 6, 7, 8, 16, 32), got 9"),
    ("bits", 0, ValueError, "Config.bits must be one of (1, 2, 3, 4, 5, 6, 7, 8, 16, 32), got 0"),
    ("group_size", 64.0, TypeError, "Config.group_size must be an int, got 64.0 (float)"),
    ("group_size", False, TypeError, "Config.group_size must be an int, got False (bool)"),
    ("group_size", 0, ValueError, "Config.group_size must be a positive int, got 0"),
    ("group_size", -512, ValueError, "Config.group_size must be a positive int, got -512"),
    ("per_row", "yes", TypeError, "Config.per_row must be a bool, got 'yes' (str)"),
    ("per_row", 1, TypeError, "Config.per_row must be a bool, got 1 (int)"),
    ("attention_bits", "8", TypeError, "Config.attention_bits must be an int, got '8' (str)"),
    ("attention_bits", 12, ValueError,
     "Config.attention_bits must be one of (1, 2, 3, 4, 5, 6, 7, 8, 16, 32), got 12"),
    ("backend", None, TypeError, "Config.backend must be a str, got None (NoneType)"),
    ("backend", "numba", ValueError,
     "Config.backend must be one of ('auto', 'torch', 'cupy', 'cpu'), got 'numba'"),
    ("resident_inputs", 1, TypeError, "Config.resident_inputs must be a bool, got 1 (int)"),
    ("per_node", "False", TypeError, "Config.per_node must be a bool, got 'False' (str)"),
    ("tag", 3, TypeError, "Config.tag must be a str or None, got 3 (int)"),
    ("offload", None, TypeError, "Config.offload must be a bool, got None (NoneType)"),
    ("prefetch_depth", 1.5, TypeError, "Config.prefetch_depth must be an int, got 1.5 (float)"),
    ("prefetch_depth", -1, ValueError, "Config.prefetch_depth must be a non-negative int, got -1"),
    ("chunk_messages", 1, TypeError, "Config.chunk_messages must be a bool, got 1 (int)"),
    ("compact_indices", "no", TypeError,
     "Config.compact_indices must be a bool, got 'no' (str)"),
    ("avg_bits", "2.5", TypeError, "Config.avg_bits must be a float, got '2.5' (str)"),
    ("avg_bits", 1.5, ValueError, "Config.avg_bits must be in [2, 8], got 1.5"),
    ("avg_bits", 9, ValueError, "Config.avg_bits must be in [2, 8], got 9"),
    ("max_noise", True, TypeError, "Config.max_noise must be a float, got True (bool)"),
    ("max_noise", 0.0, ValueError, "Config.max_noise must be positive and finite, got 0.0"),
    ("max_noise", float("inf"), ValueError,
     "Config.max_noise must be positive and finite, got inf"),
    ("adapt_interval", 0, ValueError, "Config.adapt_interval must be a positive int, got 0"),
    ("adapt_interval", 10.0, TypeError,
     "Config.adapt_interval must be an int, got 10.0 (float)"),
    ("self_check", "yes", TypeError, "Config.self_check must be a bool, got 'yes' (str)"),
    ("min_bytes", 1.0, TypeError, "Config.min_bytes must be an int, got 1.0 (float)"),
    ("min_bytes", -1, ValueError, "Config.min_bytes must be a non-negative int or None, got -1"),
    ("min_pass_savings", True, TypeError,
     "Config.min_pass_savings must be an int, got True (bool)"),
    ("min_pass_savings", -5, ValueError,
     "Config.min_pass_savings must be a non-negative int or None, got -5"),
]


def test_every_field_is_covered() -> None:
    fields = {f.name for f in dataclasses.fields(Config)}
    assert {name for name, *_ in BAD} == fields


@pytest.mark.parametrize(("name", "value", "error", "message"), BAD,
                         ids=[f"{name}={value!r}" for name, value, *_ in BAD])
def test_bad_value_raises(name: str, value: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        Config(**{name: value})
    # dataclasses.replace builds a new Config, so it validates just the same.
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        dataclasses.replace(Config(), **{name: value})


@pytest.mark.parametrize("kwargs", [
    {},
    {"bits": 1, "group_size": 1, "per_row": True, "attention_bits": 32, "backend": "torch",
     "resident_inputs": False, "per_node": True, "tag": "convs.0", "offload": True,
     "prefetch_depth": 0, "chunk_messages": False, "compact_indices": False},
    {"bits": 32, "attention_bits": None, "backend": "cupy", "tag": None},
    {"bits": None, "avg_bits": 3, "max_noise": 0.5, "adapt_interval": 7, "self_check": False},
    {"min_bytes": 0}, {"min_bytes": 1 << 20}, {"min_pass_savings": 0},
    {"min_pass_savings": 1 << 30},
])
def test_good_values_are_kept(kwargs: dict) -> None:
    config = Config(**kwargs)
    for name, value in kwargs.items():
        assert getattr(config, name) == value


def test_compressors_validate_through_config() -> None:
    # Quantize checks its fields by building a Config: the same errors, the same names.
    with pytest.raises(TypeError, match=r"^Config\.per_row must be a bool, got 'yes' \(str\)$"):
        gnnact.compress.Quantize(bits=2, per_row="yes")


def test_automatic_is_the_default() -> None:
    # bits=None: widths chosen per tensor by a converted model, avg_bits on average; they
    # start at 2 bits, the width of a layer used on its own too.
    config = Config()
    assert config.bits is None and config.automatic and config.width == 2
    assert config.avg_bits == 3.0
    assert Config(avg_bits=3.5).width == 2 and Config(bits=4).width == 4
    assert not Config(bits=4).automatic and Config().attention == 8 and not Config().exact
