r"""Noise probes: how large each compressed tensor's rounding noise is against the gradient it
feeds, measured inside an ordinary training step.

During a *probe pass* (a forward pass run inside :func:`probing`), every tensor quantized for
backward is quantized a second time at :data:`REFERENCE_BITS` (8) with rounding noise of its
own, its *alternate* :math:`\hat h'`, beside the copy :math:`\hat h` that backward uses. In
backward, right after an autograd node that restored a probed tensor has run (a post hook), the
node runs once more on the same incoming gradient with :math:`\hat h'` in place of
:math:`\hat h`, everything else the same. Its outputs :math:`g` (from :math:`\hat h`) and
:math:`g'` (from the finer :math:`\hat h'`) differ by :math:`\hat h`'s rounding error, its bias
included (a node that reads its tensor nonlinearly, a sigmoid's backward
:math:`\hat y(1-\hat y)`, is biased by the rounding's variance, which no second rounding at the
same width would show), the finer copy's own error being :math:`S(8)/S(b)` of it
(:math:`1/7225` at 2 bits). With :math:`\delta = g' - g`,

.. math::
    r = \max_k \frac{\lVert \delta_k \rVert^2}{\lVert g'_k \rVert^2},

over the node's outputs :math:`k` that the tensor changes (a weight's gradient for a linear
map's input; the input's and the scale's for BatchNorm's): the *noise ratio* of the tensor,
the mean square error its rounding adds to a gradient it feeds against that gradient's own
square. A tensor kept at 8 bits already is compared with a second 8-bit rounding instead
(:math:`\mathbb{E}\lVert\delta\rVert^2 = 2\operatorname{Var}`, hence a half). Each output
counts on its own: an optimizer such as Adam scales each parameter's step by its own gradient,
so a small gradient drowned in noise (an attention vector's) matters however large the others
are. What an output moves between two runs on the same tensors (float sums in another order)
is taken out first (:func:`noise_ratio`). A tensor several nodes read gets the largest ratio.
This is GACT's two-draw estimate (Liu et al. 2022, Alg. 1) made local: one node re-run instead
of a whole backward pass per tensor, no closure, no change to the training loop.

A probe pass costs one more quantization of each compressed tensor (the alternates are kept
until its backward ends: :attr:`NoiseProbe.nbytes`), one more run of each node that reads one
(and a third, the control, where the ratio is not small), and on a GPU one host
synchronisation per ratio read; other passes pay nothing. The probe's state belongs to one
pass: the marks on the packed tensors point at the :class:`NoiseProbe` that made them, so two
models (or threads) probing at once never see each other's alternates.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import BackwardCFunction

__all__ = ["NOT_RUN_TWICE", "REFERENCE_BITS", "UNMEASURED_BITS", "NoiseProbe", "active_probe",
           "noise_ratio", "probing", "restore"]

# The attribute of a packed tensor's first part that names its probe: (probe, key).
_MARK = "_gnnact_probe"

_PROBE: ContextVar[NoiseProbe | None] = ContextVar("gnnact_probe", default=None)


def active_probe() -> NoiseProbe | None:
    """The :class:`NoiseProbe` of the forward pass running in this context, if it probes."""
    return _PROBE.get()


@contextlib.contextmanager
def probing(probe: NoiseProbe | None) -> Iterator[None]:
    """Inside, quantizations make alternates for ``probe`` (nothing when ``None``)."""
    token = _PROBE.set(probe)
    try:
        yield
    finally:
        _PROBE.reset(token)


def restore(packed: Any) -> Tensor:
    """``packed.dequantize()``, or its alternate while a probe re-runs the node reading it.
    The unpacking of every quantized context goes through here."""
    parts = packed.tensors()
    mark = getattr(parts[0], _MARK, None) if parts else None
    if mark is None:
        return packed.dequantize()
    probe, key = mark
    return probe._restore(packed, key)


class NoiseProbe:
    r"""The noise ratios of one probe pass (see the module docstring).

    Args:
        seed (int): seed of the alternates' rounding noise (the copies backward uses draw
            theirs as in any other pass).

    Attributes:
        ratios (dict[str, float]): tensor name -> its noise ratio :math:`r` at the width it
            had, filled in backward.
        numel (dict[str, int]): tensor name -> values quantized under that name in the pass.
        bits (dict[str, int]): tensor name -> its width in the pass.
        fixed (set[str]): names whose width is not the scope's to choose (a rule of the
            policy, attention coefficients).
        nbytes (int): bytes of the alternates made.
        failures (list[str]): nodes whose second run raised (their tensors stay unmeasured).
        skipped (list[str]): nodes not run twice (:data:`NOT_RUN_TWICE`).
        unmeasurable (set[str]): names of the tensors such nodes read.
        passes (int): forward passes that joined the probe (a step of several, before its
            backward).
        done (bool): a backward pass through its nodes has ended (the engine's callback).
    """

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.ratios: dict[str, float] = {}
        self.numel: dict[str, int] = {}
        self.bits: dict[str, int] = {}
        self.fixed: set[str] = set()
        self.nbytes = 0
        self.failures: list[str] = []
        self.skipped: list[str] = []
        self.unmeasurable: set[str] = set()
        self._names: list[str] = []  # key -> name
        self._alternates: list[Any] = []  # key -> alternate (dropped once read)
        self._reference: list[bool] = []  # key -> whether its alternate is finer than it
        self._roots: list[Any] = []  # autograd nodes the pass made
        self._reads: dict[int, tuple[Any, set[int]]] = {}  # id(node) -> (node, keys read)
        self._grads: dict[int, tuple[Tensor | None, ...]] = {}  # id(node) -> its gradients
        self._swap: int | None = None  # the key whose alternate a re-run reads
        self._hooked: set[int] = set()  # ids of the nodes hooked so far
        self.passes = 0
        self.done = False
        self._queued = False  # (the end-of-backward callback)

    # ------------------------------------------------------------------ forward

    def add(self, name: str, packed: Any, again: Callable[[torch.Generator, int], Any],
            fixed: bool = False, finer: bool = True) -> None:
        """Probe ``packed``, the copy of the tensor ``name``: ``again(generator, bits)``
        quantizes the same tensor afresh at ``bits`` with noise drawn from ``generator``
        (:data:`REFERENCE_BITS`, or ``packed``'s own width from there up; its own width
        without ``finer``, for a compressor that has only one)."""
        parts = packed.tensors()
        if not parts or getattr(packed, "is_passthrough", False):
            return
        key = len(self._names)
        reference = max(packed.bits, REFERENCE_BITS) if finer else packed.bits
        alternate = again(self.generator, reference)
        self._names.append(name)
        self._alternates.append(alternate)
        self._reference.append(reference > packed.bits)
        self.numel[name] = self.numel.get(name, 0) + math.prod(packed.shape)
        self.bits[name] = packed.bits
        if fixed:
            self.fixed.add(name)
        self.nbytes += alternate.nbytes
        setattr(parts[0], _MARK, (self, key))

    def collect(self, out: Any) -> None:
        """Note the autograd nodes of the tensors in ``out`` (a result of the pass): backward
        finds the nodes to re-run from these."""
        if isinstance(out, Tensor):
            if out.grad_fn is not None:
                self._roots.append(out.grad_fn)
        elif isinstance(out, (tuple, list)):
            for item in out:
                self.collect(item)
        elif isinstance(out, dict):
            for item in out.values():
                self.collect(item)

    def arm(self) -> None:
        """At the end of a forward pass that joined the probe: hook every node reachable from
        the ones it collected (and not hooked yet), so that backward re-runs those that read a
        probed tensor. The hooks find their node as the one autograd is running and hold the
        probe weakly: no reference cycle keeps a graph alive past its backward."""
        stack, self._roots = self._roots, []
        before, after = self._hooks()
        if not self._names:
            # Nothing to measure (every tensor so far kept as is, say): only the end of the
            # backward pass, so that the probe is done and the next steps do not join it.
            for node in {id(n): n for n in stack if n is not None}.values():
                node.register_hook(after)
            return
        while stack:
            node = stack.pop()
            if node is None or id(node) in self._hooked:
                continue
            self._hooked.add(id(node))
            # A custom Function's backward may write over its incoming gradient: the second
            # run gets a copy taken before the first.
            if isinstance(node, BackwardCFunction):
                node.register_prehook(before)
            node.register_hook(after)
            stack.extend(fn for fn, _ in node.next_functions)

    def _hooks(self) -> tuple[Callable, Callable]:
        ref = weakref.ref(self)

        def before(grad_outputs: tuple) -> None:
            probe = ref()
            if probe is not None:
                node = torch._C._current_autograd_node()
                probe._grads[id(node)] = tuple(None if g is None else g.clone()
                                               for g in grad_outputs)

        def after(grad_inputs: tuple, grad_outputs: tuple) -> None:
            probe = ref()
            if probe is not None:
                probe._rerun(torch._C._current_autograd_node(), grad_inputs, grad_outputs)

        return before, after

    # ------------------------------------------------------------------ backward

    def _restore(self, packed: Any, key: int) -> Tensor:
        if self._swap is not None:  # a second run: the alternate of its tensor
            if key == self._swap:
                return self._alternates[key].dequantize()
            return packed.dequantize()
        node = torch._C._current_autograd_node()
        if node is not None:
            self._reads.setdefault(id(node), (node, set()))[1].add(key)
        return packed.dequantize()

    def _finish(self) -> None:
        self.done = True
        self._grads, self._reads = {}, {}
        self._alternates = [None] * len(self._alternates)  # (their bytes back at once)

    def finish_with_backward(self) -> None:
        """Finish when the backward pass running now ends (once). A layer run as a custom
        operator in a compiled graph (:mod:`gnnact.ops.library`) calls it before its own
        nested backward: the probe then ends with the outer pass, not the first nested one."""
        if not self.done and not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)

    def _rerun(self, node: Any, grad_inputs: tuple, grad_outputs: tuple) -> None:
        self.finish_with_backward()
        grads = self._grads.pop(id(node), grad_outputs)
        entry = self._reads.pop(id(node), None)
        if entry is None:
            return
        if node.name() in NOT_RUN_TWICE:
            self.skipped.append(node.name())
            self.unmeasurable.update(self._names[key] for key in entry[1])
            return
        runs = {key: self._run(node, grads, key) for key in sorted(entry[1])}
        runs = {key: again for key, again in runs.items() if again is not None}  # (failed)
        ratios = {key: noise_ratio(grad_inputs, again, reference=self._reference[key])
                  for key, again in runs.items()}
        if any(r is not None and r > _CONTROL for r in ratios.values()):
            # A loud one: how much the node's outputs differ between two runs on the same
            # tensors (a float sum in another order can move a gradient that cancels to
            # nearly nothing, a softmax's or an attention vector's, by as much as itself).
            control = self._run(node, grads, _CONTROL_RUN)
            if control is not None:
                ratios = {key: noise_ratio(grad_inputs, again, control,
                                           reference=self._reference[key])
                          for key, again in runs.items()}
        for key, ratio in ratios.items():
            if ratio is not None:
                name = self._names[key]
                self.ratios[name] = max(self.ratios.get(name, 0.0), ratio)

    def _run(self, node: Any, grads: tuple, swap: int) -> tuple | None:
        """The node run again on ``grads``, with the alternate of ``swap`` (none for
        :data:`_CONTROL_RUN`); ``None`` if it raised (noted in :attr:`failures`)."""
        self._swap = swap
        try:
            with torch.no_grad():
                if isinstance(node, BackwardCFunction):
                    again = node.apply(*(None if g is None else g.clone() for g in grads))
                else:
                    again = node(*grads)
        except Exception as error:  # the tensor stays unmeasured; the step goes on
            self.failures.append(f"{node.name()}: {type(error).__name__}: {error}")
            return None
        finally:
            self._swap = None
        return tuple(again) if isinstance(again, (tuple, list)) else (again,)


#: The width of a probe's second copy of a tensor kept at fewer bits: its rounding error is
#: then nearly all the first copy's (:math:`S(8)/S(2) \approx 1/7000`), bias included, which
#: a second rounding at the same width could not show (a sigmoid's or a softmax's output:
#: backward reads it nonlinearly, :math:`\hat y (1 - \hat y)`).
REFERENCE_BITS = 8

#: Nodes a probe does not run twice: a backward that runs a backward pass of its own would add
#: to the parameters' ``.grad`` a second time (reentrant checkpointing); one that runs a
#: collective (batch norm over all ranks, the halo exchange) would wait for ranks that do not
#: run it again. What only they read is kept at :data:`UNMEASURED_BITS`.
NOT_RUN_TWICE = frozenset({"CheckpointFunctionBackward", "_SyncBatchNormBackward",
                           "SyncBatchNormBackward", "_ExchangeBackward",
                           # A compiled graph's whole backward (torch.compile): it reads what
                           # the pass's pipeline kept for the graph, and runs once.
                           "CompiledFunctionBackward"})

#: The width of a tensor that only nodes in :data:`NOT_RUN_TWICE` read (it cannot be measured):
#: the width that won back nearly all that 2 bits lost on the models where 2 bits lost most
#: (SuperGAT on Cora 61.6 → 81.9 %, MixHop 68.8 → 79.1 %; fp32 82.2 and 80.3 %).
UNMEASURED_BITS = 4

# A second run whose ratio exceeds this gets a control run; the key of a run that swaps nothing.
_CONTROL = 1e-3
_CONTROL_RUN = -1


def noise_ratio(first: tuple, second: tuple, control: tuple | None = None, *,
                reference: bool = False) -> float | None:
    r"""The noise ratio of two runs of a node (see the module docstring): the largest over the
    outputs :math:`k` the runs disagree on of

    .. math::
        r_k = \frac{v_k}{s_k}, \qquad
        v_k = \kappa \max(\lVert\delta_k\rVert^2 - \lVert c_k\rVert^2, 0),

    with :math:`\delta_k` the difference of the two runs' outputs and :math:`c_k` that of a
    ``control`` run on the same tensors as the first (none: 0): what an output moves from one
    run to the next anyway, in float arithmetic, is no rounding error, and fp32 training
    carries it too (a float sum in another order moves a gradient that cancels to nearly
    nothing, GAT's target attention vector, by as much as itself). With ``reference`` the
    second run read a finer rounding (:data:`REFERENCE_BITS`): :math:`\kappa = 1`, the
    difference is the first rounding's error, its bias included, and the signal
    :math:`s_k = \lVert g'_k\rVert^2` is the finer run's; otherwise two roundings of one
    width differ by twice the variance, :math:`\kappa = \tfrac12`, and
    :math:`s_k = \lVert g_k\rVert^2 - v_k`. 0 when the runs agree everywhere (the rounding
    was exact), ``None`` when no output of both runs is a tensor; a signal at or below zero
    (noise as large as the gradient itself) gives :obj:`math.inf`."""
    kappa = 1.0 if reference else 0.5
    worst: float | None = None
    for k, (g, h) in enumerate(zip(first, second, strict=False)):
        h = _summed_to(h, g)
        if h is None:
            continue
        worst = worst or 0.0
        delta = _squared_distance(h, g)
        if not delta:
            continue
        c = _summed_to(control[k], g) if control is not None and k < len(control) else None
        if c is not None:
            delta = max(delta - _squared_distance(c, g), 0.0)
        if not delta:
            continue
        noise = kappa * delta
        signal = _squared_distance(h, None) if reference else (
            _squared_distance(g, None) - noise)
        worst = max(worst, noise / signal if signal > 0 else math.inf)
    return worst


def _summed_to(h: Any, g: Any) -> Tensor | None:
    """A re-run's output ``h`` in the shape of the engine's ``g``, or ``None`` if either is no
    tensor or they do not match. A node called directly returns the gradient of an input it
    broadcast (``alpha.view(-1, H, 1)`` times the messages) in the broadcast shape; the engine
    sums it to the input's shape before the hooks see it, and so is it compared here."""
    if not isinstance(g, Tensor) or not isinstance(h, Tensor):
        return None
    if h.shape == g.shape:
        return h
    try:
        return h.sum_to_size(g.shape)
    except RuntimeError:
        return None


def _squared_distance(a: Tensor, b: Tensor | None) -> float:
    r""":math:`\lVert a - b\rVert^2` (:math:`\lVert a\rVert^2` without ``b``), summed in
    float64 with one temporary of ``a``'s size (this runs in backward, at the step's peak)."""
    diff = a - b if b is not None else a.clone()
    return float(diff.square_().sum(dtype=torch.float64))
