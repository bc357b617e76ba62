r"""The random draws of one estimation pass, from generators of its own.

:class:`gnnact.Controller` compares passes that must draw the same dropout masks (and every
other random number) but for one tensor's rounding noise. Seeding the global generator
(:func:`torch.manual_seed`) for that would tie the estimate to a process-wide resource: another
thread's draws between two of its passes would change its masks, and its own seeding and
restoring would rewind the other thread's stream. :class:`seeded_randomness` gives the passes
their own generators instead.

It is a :class:`~torch.utils._python_dispatch.TorchDispatchMode`, so it is active in the
entering thread only and sees every random op at the ATen level, whoever calls it (gnnact's
dropout and rounding, :func:`torch.nn.functional.dropout` on CPU and CUDA, user code in the
closure, PyG's ``dropout_edge``): an op that takes a ``generator`` and got none gets the pass's
generator for its device (an op such as ``aten::rand.default`` is redirected to its
``generator`` overload), and CUDA's fused ``native_dropout``, which takes none, draws its mask
with ``bernoulli_`` from that generator. On the CPU the draws are those of
:func:`torch.manual_seed` with the same seed.

A random op with neither (fused attention kernels with dropout, cuDNN RNNs with dropout) runs
on its device's default generator, seeded for that one call from the pass's generator and
restored right after: passes of one thread stay identical, and the process's stream is left
as it was, but another thread drawing from the same default generator during that very call
can interleave with it.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from gnnact.quant.rng import draw_seed

__all__ = ["seeded_randomness"]


def _generator_free(schema: torch.FunctionSchema) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in schema.arguments if a.name != "generator"]


@functools.cache
def _with_generator(func: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The overload of ``func`` that takes a ``generator`` and otherwise the same arguments
    (``aten::rand.default`` -> ``aten::rand.generator``): ``func`` itself if it takes one,
    ``None`` if there is none."""
    if any(a.name == "generator" for a in func._schema.arguments):
        return func
    own = _generator_free(func._schema)
    for name in func.overloadpacket.overloads():
        other = getattr(func.overloadpacket, name)
        if (any(a.name == "generator" for a in other._schema.arguments)
                and _generator_free(other._schema) == own):
            return other
    return None


def _device(args: tuple, kwargs: dict) -> torch.device:
    """Where an op's random numbers are drawn: its ``device`` argument, else its first
    tensor's device (the CPU for a factory without one)."""
    if kwargs.get("device") is not None:
        device = torch.device(kwargs["device"])
    else:
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]
        device = tensors[0].device if tensors else torch.device("cpu")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


class seeded_randomness(TorchDispatchMode):
    r"""Within the block, in this thread, every random op draws from a generator of the block,
    one per device, seeded with ``seed`` (see the module docstring). The process's default
    generators are neither read nor advanced.

    Args:
        seed (int): the seed of every device's generator.

    Example:
        >>> from gnnact.adaptive.randomness import seeded_randomness
        >>> x = torch.ones(8)
        >>> with seeded_randomness(0):
        ...     a = torch.nn.functional.dropout(x, 0.5)
        >>> with seeded_randomness(0):
        ...     b = torch.nn.functional.dropout(x, 0.5)
        >>> torch.equal(a, b)
        True
    """

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seed = seed
        self.generators: dict[torch.device, torch.Generator] = {}

    def generator(self, device: torch.device) -> torch.Generator:
        """This block's generator on ``device`` (created and seeded on first use)."""
        generator = self.generators.get(device)
        if generator is None:
            generator = torch.Generator(device=device).manual_seed(self.seed)
            self.generators[device] = generator
        return generator

    def __torch_dispatch__(self, func: torch._ops.OpOverload, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        seeded = torch.Tag.nondeterministic_seeded in func.tags
        if not seeded or kwargs.get("generator") is not None:
            return func(*args, **kwargs)
        device = _device(args, kwargs)
        if device.type == "meta":  # no numbers drawn
            return func(*args, **kwargs)
        overload = _with_generator(func)
        if overload is not None:
            return overload(*args, **kwargs, generator=self.generator(device))
        if func is torch.ops.aten.native_dropout.default:
            return self._native_dropout(device, *args, **kwargs)
        return self._on_default_generator(device, func, args, kwargs)

    def _native_dropout(self, device: torch.device, input: Tensor, p: float,
                        train: bool | None) -> tuple[Tensor, Tensor]:
        # As the CUDA kernel computes it: a Bernoulli(1 - p) keep mask, the output scaled by
        # 1 / (1 - p) (0 for p = 1); evaluation returns the input and an all-true mask.
        if train is False:
            return input.clone(), torch.ones_like(input, dtype=torch.bool)
        mask = torch.empty_like(input, dtype=torch.bool).bernoulli_(
            1 - p, generator=self.generator(device))
        scale = 0.0 if p == 1 else 1.0 / (1 - p)
        return input * mask * scale, mask

    def _on_default_generator(self, device: torch.device, func: torch._ops.OpOverload,
                              args: tuple, kwargs: dict) -> Any:
        if device.type == "cpu":
            default = torch.default_generator
        elif device.type == "cuda":
            default = torch.cuda.default_generators[device.index]
        else:  # no default generator to seed that we know of: as it comes
            return func(*args, **kwargs)
        seed = draw_seed(self.generator(device))
        state = default.get_state()
        default.manual_seed(seed)
        try:
            return func(*args, **kwargs)
        finally:
            default.set_state(state)
