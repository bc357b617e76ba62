r"""Automatic precision: the widths of a converted model's compressed tensors, chosen while it
trains, with no change to the training loop.

A model converted with the default ``Config()`` (``bits=None``) carries an
:class:`AutoPrecision` in its scope. Every training forward pass counts as a step. At
scheduled steps (the first after 1, 2, 4, … steps, the gaps doubling up to
``config.adapt_interval``) the pass is a *probe*: each compressed tensor's noise ratio
:math:`r_l`, the variance its rounding adds to the gradient it feeds against that gradient's
square, is measured inside the ordinary backward pass (:mod:`gnnact.ops.probe`); a step of
several forward passes before its backward (an encoder's and a decoder's) is probed whole. At
the first pass after that backward the widths are allocated from these ratios:

* **self-check** (a floor): tensor :math:`l` gets at least the least width :math:`f_l` at which
  :math:`r_l(b) = r_l(b^{m}_l)\, S(b) / S(b^{m}_l) \le \tau` (``config.max_noise``), with
  :math:`S(b) = (2^b-1)^{-2}` the variance factor of :math:`b`-bit rounding and
  :math:`b^m_l` the width it was measured at. A tensor whose noise is comparable to its
  gradient is raised, beyond the budget if need be;
* **budget**: within :math:`\sum_l b_l D_l \le \bar b \sum_l D_l` (``config.avg_bits``) the
  widths minimise :math:`\sum_l r_l(b_l)`, the summed relative noise
  (:func:`~gnnact.adaptive.allocator.allocate`, exact).

Each tensor has its own width, a twin's too (its input apart from its attention features, say:
:attr:`ForwardState.widths <gnnact.ops.state.ForwardState>` overrides the twin's one
``config.bits`` per tensor); the attention coefficients and the tensors a policy rule
compresses keep their own width (:attr:`TensorWidth.fixed`) but are measured and reported all
the same. Until its first probe a tensor keeps the width it started
at (2 bits, attention at 8); one that only nodes a probe cannot run twice read (a reentrant
checkpoint, batch norm over several ranks: :data:`~gnnact.ops.probe.NOT_RUN_TWICE`) is kept at
:data:`~gnnact.ops.probe.UNMEASURED_BITS` (4). The first step is an ordinary one; a probe
step costs one more quantization per tensor and one more run of each node that reads one,
and probes thin out to one per ``adapt_interval`` steps.

Use :class:`gnnact.Controller` instead for GACT's own estimate (a closure, and one whole
forward/backward pass per tensor at each estimate): it measures each tensor's share of the
variance of the whole parameter gradient rather than of the gradients of the node that reads
it.
"""

from __future__ import annotations

import math
import warnings
import zlib
from dataclasses import dataclass

from gnnact.adaptive.allocator import allocate, variance_factor
from gnnact.config import Config
from gnnact.ops.probe import UNMEASURED_BITS, NoiseProbe

__all__ = ["AUTO_WIDTHS", "FIRST_CHECK", "AutoPrecision", "TensorWidth"]

#: The forward passes a probe is joined by, at most, before a backward pass goes through it:
#: beyond, it is dropped (the model ran forward passes with no backward, evaluation in training
#: mode, say) and the next scheduled step probes again.
_JOINING = 16

#: With fixed widths, the step of the first check.
FIRST_CHECK = 10

#: The widths the automatic allocation chooses from: 1 bit is left out (its variance is nine
#: times 2 bits' for the few bytes it saves).
AUTO_WIDTHS: tuple[int, ...] = (2, 3, 4, 5, 6, 7, 8)


@dataclass
class TensorWidth:
    r"""One compressed tensor of :class:`AutoPrecision` (all quantizations of one name in a
    pass: a twin's role, a functional op's, a tensor of the generic pipeline).

    Args:
        name (str): ``"<module path>:<role or index>"``.
        numel (int): values quantized under this name in the last probe pass.
        bits (int): the width it has now.
        measured (float, optional): the noise ratio last measured, :obj:`None` before.
        measured_bits (int, optional): the width it had then.
        fixed (bool, optional): its width is not the allocation's (attention coefficients, a
            policy rule). (default: :obj:`False`)
        unmeasurable (bool, optional): only nodes a probe does not run twice read it
            (:data:`~gnnact.ops.probe.NOT_RUN_TWICE`): it is kept at
            :data:`~gnnact.ops.probe.UNMEASURED_BITS`. (default: :obj:`False`)
        reason (str, optional): why it has its width.

    Example:
        >>> from gnnact.adaptive import TensorWidth
        >>> t = TensorWidth("conv1:activations", 10_000, 3, measured=0.9, measured_bits=2)
        >>> round(t.ratio, 3), round(t.ratio_at(4), 4)  # the variance scales as S(b)
        (0.165, 0.036)
    """

    name: str
    numel: int
    bits: int
    measured: float | None = None
    measured_bits: int | None = None
    fixed: bool = False
    unmeasurable: bool = False
    reason: str = "start width (not measured yet)"

    def ratio_at(self, bits: int) -> float | None:
        """The noise ratio it would have at ``bits`` (the variance scales as :math:`S(b)`);
        :obj:`None` before a measurement."""
        if self.measured is None or self.measured_bits is None:
            return None
        return self.measured * variance_factor(bits) / variance_factor(self.measured_bits)

    @property
    def ratio(self) -> float | None:
        """The noise ratio at :attr:`bits`."""
        return self.ratio_at(self.bits)


class AutoPrecision:
    r"""The automatic widths of one converted model (see the module docstring); its
    :class:`~gnnact.nn.scope.Scope` owns it and calls :meth:`begin` at each training forward
    pass.

    With a fixed ``config.bits`` nothing is allocated: probes at step :data:`FIRST_CHECK` and
    every ``adapt_interval`` steps after measure all the same, and a tensor whose noise ratio
    exceeds ``max_noise`` is reported (a :class:`RuntimeWarning`, once per tensor, and its
    reason in :func:`gnnact.summary`).

    Args:
        config (Config): ``bits`` (``None``: allocate), ``avg_bits``, ``max_noise`` and
            ``adapt_interval``.
        seed (int, optional): seed of the probes' alternate roundings. (default: :obj:`0`)

    Attributes:
        tensors (dict[str, TensorWidth]): the compressed tensors by name.
        widths (dict[str, int]): the allocated width of each tensor not
            :attr:`~TensorWidth.fixed`.
        steps (int): training forward passes so far.
        probes (int): probe passes so far.
        allocations (int): allocations so far (one after each probe).
        over_budget (bool): the floors of the last allocation exceeded ``avg_bits``.
        failures (list[str]): probe re-runs that raised (their tensors stay unmeasured).
        probe_bytes (int): bytes of the last probe's alternate copies.

    Example:
        >>> from gnnact.adaptive import AutoPrecision
        >>> auto = AutoPrecision(gnnact.Config(adapt_interval=8))
        >>> auto.schedule(40)  # the probe steps among the first 40
        [1, 2, 4, 8, 16, 24, 32]
    """

    def __init__(self, config: Config, seed: int = 0) -> None:
        self.adapt = config.automatic
        self.avg_bits = config.avg_bits
        self.max_noise = config.max_noise
        self.interval = config.adapt_interval
        self.seed = seed
        self.tensors: dict[str, TensorWidth] = {}
        self.widths: dict[str, int] = {}
        self.steps = 0
        self.probes = 0
        self.allocations = 0
        self.over_budget = False
        self.failures: list[str] = []
        self.probe_bytes = 0
        self._pending: NoiseProbe | None = None
        self._next_probe = self._first()  # (step 0 runs at the start widths)
        self._warned: set[str] = set()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        # A pending probe belongs to the pass that made it (its alternates, autograd nodes):
        # a copy of the model starts without one, measuring at its next probe.
        state["_pending"] = None
        return state

    # ------------------------------------------------------------------ schedule

    def _first(self) -> int:
        """The first probe step: 1 when allocating; when only checking fixed widths, a few
        steps in (:data:`FIRST_CHECK`), once the weights have moved off their start."""
        return 1 if self.adapt else min(FIRST_CHECK, self.interval)

    def _gap(self, probe: int) -> int:
        """Steps from probe number ``probe`` (0 first) to the next: doubling up to the
        interval when allocating, the interval when checking."""
        if not self.adapt:
            return self.interval
        return min(1 << min(probe, 62), self.interval)

    def schedule(self, steps: int) -> list[int]:
        """The steps, of the first ``steps``, that probe (step 0 never does: it runs at the
        start widths, as fast as a fixed-width step)."""
        out, step = [], self._first()
        while step < steps:
            out.append(step)
            step += self._gap(len(out) - 1)
        return out

    def begin(self) -> NoiseProbe | None:
        """At the start of a training forward pass: allocate from the last probe once a
        backward pass has gone through it, and return the probe this pass joins, if any: a
        new one at a scheduled step, or the last one while its backward is still to come (a
        step of several forward passes, an encoder's and a decoder's, say, is probed whole).
        """
        probe = self._pending
        if probe is not None:
            if probe.done:
                self._pending = None
                self.update(probe)
            elif probe.passes < _JOINING:
                probe.passes += 1
                self.steps += 1
                return probe
            else:  # no backward reached it
                self._pending = None
        step = self.steps
        self.steps += 1
        # (A step the last probe's joining passes took counts as reached: the next pass probes.)
        if step < self._next_probe:
            return None
        self._next_probe = step + self._gap(self.probes)
        self.probes += 1
        word = zlib.crc32(f"probe|{self.seed}|{self.probes}".encode())
        self._pending = NoiseProbe(word)
        self._pending.passes = 1
        return self._pending

    # ------------------------------------------------------------------ allocation

    def update(self, probe: NoiseProbe) -> dict[str, int]:
        """Fold in the ratios ``probe`` measured and allocate; returns :attr:`widths`."""
        self.failures = list(probe.failures)
        self.probe_bytes = probe.nbytes
        tensors: dict[str, TensorWidth] = {}
        for name, numel in probe.numel.items():
            t = tensors[name] = TensorWidth(name, numel, probe.bits[name],
                                            fixed=name in probe.fixed)
            ratio = probe.ratios.get(name)
            old = self.tensors.get(name)
            if ratio is not None:
                t.measured, t.measured_bits = ratio, t.bits
            elif old is not None:  # what it measured before, until it measures again
                t.measured, t.measured_bits = old.measured, old.measured_bits
            t.unmeasurable = t.measured is None and name in probe.unmeasurable
        for name, t in self.tensors.items():  # those of passes this probe did not see
            tensors.setdefault(name, t)
        self.tensors = tensors
        self._allocate()
        self.allocations += 1
        return self.widths

    @property
    def average_bits(self) -> float | None:
        """Bits per compressed value over every tensor of the last probe (``None`` before)."""
        total = sum(t.numel for t in self.tensors.values())
        return sum(t.bits * t.numel for t in self.tensors.values()) / total if total else None

    def _check(self) -> None:
        """Fixed widths (``Config(bits=b)``): report, and warn once per tensor, where the
        noise ratio exceeds ``max_noise``; change nothing."""
        for t in self.tensors.values():
            ratio = t.ratio
            if ratio is None:
                t.reason = "fixed width (not measured yet)"
                continue
            if ratio <= self.max_noise:
                t.reason = "fixed width"
                continue
            t.reason = f"fixed width; noise ratio > {self.max_noise:g}: needs more bits"
            if t.name not in self._warned:
                self._warned.add(t.name)
                warnings.warn(
                    f"gnnact: the rounding noise of {t.name} at {t.bits} bits is {ratio:.2g} of "
                    f"the gradient it feeds (more than max_noise={self.max_noise:g}); it slows "
                    f"or stops training. Raise Config.bits, or convert with the default "
                    f"Config() to choose widths automatically", RuntimeWarning, stacklevel=2)

    def _allocate(self) -> None:
        if not self.adapt:
            self._check()
            return
        free = [t for t in self.tensors.values() if not t.fixed]
        for t in self.tensors.values():
            if t.fixed:
                t.reason = "its own width (attention coefficients or a policy rule)"
            elif t.unmeasurable:
                t.bits = self.widths[t.name] = max(t.bits, UNMEASURED_BITS)
                t.reason = ("not measurable: only nodes a probe does not run twice read it "
                            "(a checkpoint, a collective in backward)")
            elif t.measured is None:
                t.reason = "start width (not measured: no gradient reached it)"
        measured = [t for t in free if t.measured is not None]
        if not measured:
            return
        floors = [self._floor(t) for t in measured]
        # The budget counts every allocated value, the unmeasured ones at their width.
        sizes = [t.numel for t in measured]
        rest = sum(t.bits * t.numel for t in free if t.measured is None)
        budget = max((self.avg_bits * sum(t.numel for t in free) - rest) / sum(sizes),
                     AUTO_WIDTHS[0])
        # Sensitivity per unit of S(b): then sum_l c_l S(b_l) is the summed noise ratio.
        sensitivity = [t.measured / variance_factor(t.measured_bits) for t in measured]
        bits = allocate([c if math.isfinite(c) else 0.0 for c in sensitivity], sizes, budget,
                        AUTO_WIDTHS, floors)
        self.over_budget = sum(b * d for b, d in zip(bits, sizes, strict=True)) > (
            budget * sum(sizes) + 1e-6)
        for t, b, floor in zip(measured, bits, floors, strict=True):
            t.bits = self.widths[t.name] = b
            if b > floor:
                t.reason = "budget: more bits lower the summed noise most here"
            elif b == AUTO_WIDTHS[0]:
                t.reason = f"noise ratio <= {self.max_noise:g} at {b} bits"
            else:
                t.reason = (f"self-check: noise ratio {t.ratio_at(b - 1):.2g} > "
                            f"{self.max_noise:g} at {b - 1} bits")

    def _floor(self, t: TensorWidth) -> int:
        """The least width of :data:`AUTO_WIDTHS` whose noise ratio is at most ``max_noise``
        (the widest if none)."""
        for b in AUTO_WIDTHS:
            ratio = t.ratio_at(b)
            if ratio is not None and ratio <= self.max_noise:
                return b
        return AUTO_WIDTHS[-1]
