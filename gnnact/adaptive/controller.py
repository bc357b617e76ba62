r"""``gnnact.Controller``: per-tensor adaptive bits from measured gradient sensitivity (GACT).

Every compressed tensor of a converted model is named by the module that keeps it and its role
there (``"convs.1:activations"``, ``"convs.0:attention"`` for GAT's coefficients). Its
sensitivity :math:`c_l` is the compression variance it adds to the gradient per unit of
:math:`S(b) = (2^b - 1)^{-2}` (GACT, Liu et al. 2022, Algorithm 1):

.. math::
    c_l = \frac{\lVert g_0 - g_l \rVert^2}{2\, S(b_l)},

where :math:`g_0` and :math:`g_l` are gradients of two passes identical in everything (dropout
masks, every other tensor's rounding noise) except tensor :math:`l`'s rounding noise, so
:math:`\mathbb{E}\lVert g_0 - g_l\rVert^2 = 2 \operatorname{Var}_l = 2 c_l S(b_l)`. The
widths then minimise :math:`\sum_l c_l S(b_l)` within :math:`\sum_l b_l D_l \le \bar b \sum_l
D_l` (:func:`~gnnact.adaptive.allocator.allocate`, exact).

An estimate costs one forward and backward pass per tensor plus one (the passes run on the
model's parameters without touching ``.grad``, and BatchNorm running statistics are restored
afterwards, also when a pass fails), so it runs only now and then. Its passes draw their
dropout masks and every other random number from generators of their own
(:class:`~gnnact.adaptive.randomness.seeded_randomness`), never from the process's: an
estimate gives the same widths whatever the global seed, whatever other threads draw
meanwhile, and leaves the training's random stream where it was. Sensitivities move most while
the weights leave their initialisation and settle after the first epochs (GACT, Fig. 3c), so
the estimates are spaced by exponential backoff, as Adacc spaces its re-tuning: at step 0, then
after gaps of ``first_interval`` steps doubling up to ``adapt_interval``, then every
``adapt_interval`` steps (:meth:`Controller.schedule`). An estimate that fails (out of memory,
say) warns and leaves the widths as they were; the next step of the schedule tries again.

Use, two lines in a training loop (the closure is how the controller re-runs forward passes
with controlled noise; it must return the loss and not call ``backward``)::

    controller = gnnact.Controller(model, avg_bits=2, adapt_interval=100)
    closure = lambda: F.cross_entropy(model(x, adj)[mask], y[mask])
    for epoch in range(epochs):
        controller.adapt(closure)          # re-estimates at steps 0, 10, 30, 70, 150, 250, ...
        optimizer.zero_grad()
        closure().backward()
        optimizer.step()
        controller.observe()               # optional: the variance alarm, reads .grad

Any model, through the saved-tensor pipeline (the controller enters ``hooks`` around the
closure for its estimates; the training step enters it the same way)::

    hooks = gnnact.compress_saved_tensors(gnnact.Config(bits=2), model=model)
    controller = gnnact.Controller(model, avg_bits=2, hooks=hooks)
    closure = lambda: F.cross_entropy(model(x), y)
    for step in range(steps):
        controller.adapt(closure)
        optimizer.zero_grad()
        with hooks:
            loss = closure()
        loss.backward()
        optimizer.step()
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from gnnact.adaptive.allocator import WIDTHS, allocate, variance_factor
from gnnact.adaptive.randomness import seeded_randomness
from gnnact.hooks import compress_saved_tensors
from gnnact.nn._base import _Compressed
from gnnact.nn.scope import scope_of
from gnnact.ops.context import controlled_noise
from gnnact.quant.packed import packed_nbytes

__all__ = ["CompressedTensor", "Controller"]

@dataclass
class CompressedTensor:
    r"""One named compressed tensor (all quantizations of a module's role in one pass), as
    :class:`gnnact.Controller` tracks it in ``Controller.tensors``.

    Args:
        name (str): ``"<module>:<role>"``, e.g. ``"convs.1:activations"``.
        module (str): the module's tag (its path in the model), or the module path of a
            tensor of a :class:`gnnact.compress_saved_tensors` pipeline.
        role (str): the tensor's role in the module (``"activations"``, ``"attention"``, …).
        shapes (list[tuple[int, ...]], optional): the shape of each quantization in one
            forward pass. (default: :obj:`[]`)
        bits (int, optional): the current width :math:`b_l`. (default: :obj:`2`)
        sensitivity (float, optional): the measured :math:`c_l`; :obj:`None` before an
            estimate. (default: :obj:`None`)

    Example:
        >>> from gnnact.adaptive import CompressedTensor
        >>> t = CompressedTensor("convs.1:activations", "convs.1", "activations",
        ...                      shapes=[(500, 32)], bits=2)
        >>> t.numel, t.nbytes(group_size=512)  # 32 groups: 128 code bytes + 8 bytes each
        (16000, 4352)
    """

    name: str
    module: str
    role: str
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    bits: int = 2
    sensitivity: float | None = None

    @property
    def numel(self) -> int:
        """:math:`D_l`: values quantized per forward pass."""
        return sum(math.prod(s) for s in self.shapes)

    def nbytes(self, group_size: int) -> int:
        """Packed bytes at :attr:`bits`: codes plus a float32 scale and zero per group."""
        return sum(packed_nbytes(math.prod(s), self.bits, group_size) for s in self.shapes)


class Controller:
    r"""Adaptive per-tensor bit widths for a model converted by :func:`gnnact.convert`, from
    GACT's estimate. The controller takes the widths over: the scope's automatic ones
    (:mod:`gnnact.adaptive.auto`), or the self-check of fixed ones, stop when it is made.

    Args:
        model (torch.nn.Module): the model; its gnnact modules (:func:`gnnact.convert`) get a
            ``config.tag`` (their path) and, after each adaptation, their own ``bits``.
        avg_bits (float, optional): :math:`\bar b`, the average bits per compressed value.
            (default: :obj:`2.0`)
        adapt_interval (int, optional): the longest gap between two estimates, in
            :meth:`adapt` calls; the first call always estimates. (default: :obj:`100`)
        first_interval (int, optional): the first gap; each next gap doubles until it
            reaches ``adapt_interval``. :obj:`None` for ``adapt_interval`` from the start.
            (default: :obj:`10`)
        hooks (compress_saved_tensors, optional): a saved-tensor pipeline whose
            :class:`~gnnact.compress.Quantize`- and :class:`~gnnact.compress.Division`-compressed
            tensors are adapted too, by name (:attr:`compress_saved_tensors.bits`); the
            estimation passes run the closure inside it, so the closure must not enter it
            itself. (default: :obj:`None`)
        widths (tuple[int, ...], optional): allowed widths. (default: 1 to 8)
        adapt_attention (bool, optional): also adapt GAT's attention coefficients; when
            :obj:`False` they stay at ``config.attention`` (8 bits by default, GACT's
            recommendation) and count against no budget. (default: :obj:`False`)
        samples (int, optional): perturbed-pass pairs averaged per estimate. (default: :obj:`1`)
        alarm_ratio (float, optional): :meth:`observe` warns when the estimated compression
            variance exceeds this multiple of the gradient's own variance. (default: :obj:`1.0`)
        seed (int, optional): seed of the estimation passes' rounding noise and of their own
            random generators (dropout masks); the global seed plays no part.
            (default: :obj:`0`)

    Raises:
        ValueError: if ``avg_bits`` is below the smallest width, ``adapt_interval``,
            ``first_interval`` or ``samples`` is not positive, or the model has no gnnact
            module and no ``hooks`` are given.
        TypeError: if ``hooks`` is not a :class:`gnnact.compress_saved_tensors`.

    Example:
        >>> import torch.nn.functional as F
        >>> from torch_geometric.nn.models import GCN
        >>> from gnnact.data import synthetic_graph
        >>> data = synthetic_graph(500, 8, 16, 4, seed=0)
        >>> config = gnnact.Config(min_bytes=0)  # (a toy graph: no tensor over the floor)
        >>> model = gnnact.convert(GCN(16, 32, num_layers=3, out_channels=4), config)
        >>> controller = gnnact.Controller(model, avg_bits=2, adapt_interval=100)
        >>> optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        >>> def closure():  # the loss of a forward pass, without backward
        ...     out = model(data.x, data.edge_index)
        ...     return F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        >>> for step in range(3):
        ...     adapted = controller.adapt(closure)  # estimates and assigns at step 0
        ...     optimizer.zero_grad()
        ...     closure().backward()
        ...     optimizer.step()
        >>> controller.adaptations
        1
        >>> sorted(controller.tensors)  # the inputs of convs 1 and 2 (x itself is resident)
        ['convs.1:activations', 'convs.2:activations']
    """

    def __init__(self, model: nn.Module, avg_bits: float = 2.0, adapt_interval: int = 100, *,
                 first_interval: int | None = 10,
                 hooks: compress_saved_tensors | None = None,
                 widths: tuple[int, ...] = WIDTHS, adapt_attention: bool = False,
                 samples: int = 1, alarm_ratio: float = 1.0, seed: int = 0) -> None:
        if not avg_bits >= min(widths):
            raise ValueError(f"avg_bits must be at least {min(widths)}, got {avg_bits}")
        for name, value in (("adapt_interval", adapt_interval),
                            ("first_interval", 1 if first_interval is None else first_interval)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if samples < 1:
            raise ValueError(f"samples must be at least 1, got {samples}")
        if hooks is not None and not isinstance(hooks, compress_saved_tensors):
            raise TypeError(f"hooks must be a gnnact.compress_saved_tensors, got {hooks!r}")
        self.model = model
        self.hooks = hooks
        self.avg_bits = float(avg_bits)
        self.adapt_interval = adapt_interval
        self.first_interval = first_interval
        self.widths = tuple(sorted(widths))
        self.adapt_attention = adapt_attention
        self.samples = samples
        self.alarm_ratio = alarm_ratio
        self.seed = seed
        self.modules: dict[str, nn.Module] = {}
        for name, module in model.named_modules():
            if isinstance(module, _Compressed):
                tag = name or "<model>"  # as gnnact.convert tags it
                module.config = dataclasses.replace(module.config, tag=tag)
                self.modules[tag] = module
        # The converted model's scope: the widths of functional ops' tensors and of the
        # generic pipeline's (convs without a twin) are set there, by name.
        self.scope = scope_of(model)
        if self.scope is not None and self.scope.auto is not None:
            # The controller sets the widths now: the scope's own allocation (or check, whose
            # probes would also run inside the estimates' passes) steps aside.
            self.scope.auto = None
        if not self.modules and hooks is None and self.scope is None:
            raise ValueError("model has no gnnact modules: call gnnact.convert(model) first, or "
                             "pass hooks=gnnact.compress_saved_tensors(...)")
        self.tensors: dict[str, CompressedTensor] = {}
        self.calls = 0
        self.adaptations = 0
        self.failures = 0  # estimates of adapt() that raised
        self._scheduled = 0  # estimates adapt() has started, failed ones included
        self._next_estimate = 0  # the adapt() call that estimates next
        self.last_cost_s = 0.0  # seconds of the last estimate
        self.last_passes = 0  # forward/backward passes of the last estimate
        self._grad_mean: Tensor | None = None
        self._grad_var = 0.0
        self._observed = 0
        self._warned_at = -1

    # ------------------------------------------------------------------ estimation

    def _params(self) -> list[Tensor]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def _gradient(self, closure: Callable[[], Tensor], params: list[Tensor], seed: int,
                  perturb: tuple[str, str] | None, record: list | None = None) -> Tensor:
        # The same dropout masks in every pass with this seed, from generators of this pass
        # (and this thread) alone.
        with seeded_randomness(seed), controlled_noise(seed, perturb, record):
            if self.hooks is None:
                loss = closure()
            else:
                with self.hooks:
                    loss = closure()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1).double()
                          for g, p in zip(grads, params, strict=True)])

    def estimate(self, closure: Callable[[], Tensor]) -> dict[str, float]:
        """Measure :math:`c_l` for every compressed tensor (see the module docstring) at the
        current widths; returns ``{name: c_l}``.

        The model comes out as it went in, also when a pass raises: parameters and their
        ``.grad`` untouched, buffers (BatchNorm running statistics) restored, the train/eval
        mode restored, the process's random generators neither read nor advanced."""
        start = time.perf_counter()
        params = self._params()
        buffers = {name: b.detach().clone() for name, b in self.model.named_buffers()}
        was_training = self.model.training
        self.model.train()
        sums: dict[str, float] = {}
        passes = 0
        try:
            for sample in range(self.samples):
                seed = self.seed * 1_000_003 + self.adaptations * 101 + sample
                record: list = []
                g0 = self._gradient(closure, params, seed, None, record)
                passes += 1
                if sample == 0:
                    self._discover(record)
                    if not self.tensors:
                        raise RuntimeError(
                            "no compressed tensor was recorded in the closure's forward "
                            "pass: convert the model with bits of 1-8 and let the closure "
                            "run it in grad mode")
                for name, t in self.tensors.items():
                    g1 = self._gradient(closure, params, seed, (t.module, t.role))
                    passes += 1
                    sq = float((g0 - g1).pow(2).sum())
                    sums[name] = sums.get(name, 0.0) + sq / (2 * variance_factor(t.bits))
        finally:  # also after a failed pass: the training goes on from the same state
            with torch.no_grad():
                for name, b in self.model.named_buffers():
                    b.copy_(buffers[name])
            self.model.train(was_training)
        for name, total in sums.items():
            self.tensors[name].sensitivity = total / self.samples
        self.last_cost_s = time.perf_counter() - start
        self.last_passes = passes
        return {name: t.sensitivity for name, t in self.tensors.items()}

    def _adaptive(self, name: str, role: str) -> bool:
        """Whether the tensor ``name`` (not a twin's) can be adapted: a tensor of ``hooks`` or
        of the scope's pipeline whose compressor is adaptive, or a functional op's tensor (its
        role is a word, the pipeline's an index)."""
        if self.hooks is not None and name in self.hooks.tensors:
            return self.hooks.tensors[name].adaptive
        if self.scope is None:
            return False
        if not role.isdigit():
            return True
        last = self.scope.last
        return last is not None and name in last.tensors and last.tensors[name].adaptive

    def _discover(self, record: list) -> None:
        found: dict[str, CompressedTensor] = {}
        for tag, role, _numel, shape, bits in record:
            name = f"{tag}:{role}"
            if tag in self.modules:
                if role == "attention" and not self.adapt_attention:
                    continue
            elif not self._adaptive(name, role):
                continue  # not compressed by this model, or a Mesa tensor (not adaptive)
            t = found.setdefault(name, CompressedTensor(name, tag, role, bits=bits))
            t.shapes.append(shape)
        for name, t in found.items():  # keep what is known across re-discoveries
            if name in self.tensors:
                t.sensitivity = self.tensors[name].sensitivity
        self.tensors = found

    # ------------------------------------------------------------------ allocation

    def assign(self) -> dict[str, int]:
        """Allocate widths from the current sensitivities and give them to the modules."""
        tensors = [t for t in self.tensors.values() if t.sensitivity is not None]
        if not tensors:
            raise RuntimeError("no sensitivities yet: call estimate() (or adapt()) first")
        bits = allocate([t.sensitivity for t in tensors], [t.numel for t in tensors],
                        self.avg_bits, self.widths)
        for t, b in zip(tensors, bits, strict=True):
            t.bits = b
            if t.module not in self.modules:  # a tensor of a saved-tensor pipeline or the scope
                if self.hooks is not None and t.name in self.hooks.tensors:
                    self.hooks.bits[t.name] = b
                else:
                    assert self.scope is not None
                    self.scope.bits[t.name] = b
                continue
            module = self.modules[t.module]
            key = "attention_bits" if t.role == "attention" else "bits"
            module.config = dataclasses.replace(module.config, **{key: b})
        return {t.name: t.bits for t in tensors}

    def _gap(self, estimate: int) -> int:
        """Steps from scheduled estimate number ``estimate`` (0 first) to the next."""
        if self.first_interval is None:
            return self.adapt_interval
        return min(self.first_interval << min(estimate, 62), self.adapt_interval)

    def schedule(self, steps: int) -> list[int]:
        """The :meth:`adapt` calls, of the first ``steps``, that estimate and assign.

        Example:
            >>> from torch_geometric.nn.models import GCN
            >>> model = gnnact.convert(GCN(8, 16, num_layers=2, out_channels=3))
            >>> Controller(model, adapt_interval=100).schedule(400)
            [0, 10, 30, 70, 150, 250, 350]
            >>> Controller(model, adapt_interval=100, first_interval=None).schedule(400)
            [0, 100, 200, 300]
        """
        out, step = [], 0
        while step < steps:
            out.append(step)
            step += self._gap(len(out) - 1)
        return out

    def adapt(self, closure: Callable[[], Tensor]) -> bool:
        """Once per training step, before it: at the steps of :meth:`schedule` (the first call
        included) :meth:`estimate` and :meth:`assign`. Returns whether it adapted.

        An estimate that raises an :class:`Exception` (an out-of-memory error, say) does not
        stop the training: it warns (a :class:`RuntimeWarning` naming the error and the step),
        the widths stay as they were, the model's state is as before (see :meth:`estimate`),
        and the next step of the schedule tries again (:attr:`failures` counts them).
        """
        step = self.calls
        self.calls += 1
        if step != self._next_estimate:
            return False
        # The schedule goes on whatever happens to this estimate.
        self._next_estimate += self._gap(self._scheduled)
        self._scheduled += 1
        try:
            self.estimate(closure)
            self.assign()
        except Exception as error:  # not KeyboardInterrupt/SystemExit: those must stop
            self.failures += 1
            warnings.warn(f"gnnact.Controller: the estimate at step {step} failed "
                          f"({type(error).__name__}: {error}); the widths stay as they were "
                          f"and the next estimate is at step {self._next_estimate}",
                          RuntimeWarning, stacklevel=2)
            return False
        self.adaptations += 1
        return True

    # ------------------------------------------------------------------ monitoring

    def compression_variance(self) -> float:
        r""":math:`\sum_l c_l S(b_l)` at the current widths (0 before an estimate)."""
        return sum(t.sensitivity * variance_factor(t.bits) for t in self.tensors.values()
                   if t.sensitivity is not None)

    def observe(self, momentum: float = 0.9, warmup: int = 10) -> dict[str, float]:
        r"""Track the gradient's own variance from the parameters' ``.grad`` (after backward):
        running mean :math:`m \leftarrow \mu m + (1-\mu) g` and
        :math:`v \leftarrow \mu v + (1-\mu)\lVert g - m\rVert^2`. After ``warmup`` steps,
        warns (once per adaptation) when the compression variance exceeds ``alarm_ratio``
        times :math:`v`, naming the tensors that contribute most.

        Returns ``{"gradient_variance": v, "compression_variance": ...}``.
        """
        grads = [p.grad.reshape(-1).double() for p in self._params() if p.grad is not None]
        if not grads:
            raise RuntimeError("no gradients to observe: call observe() after backward()")
        g = torch.cat(grads)
        if self._grad_mean is None or self._grad_mean.shape != g.shape:
            self._grad_mean, self._grad_var = g.clone(), 0.0
        else:
            self._grad_var = momentum * self._grad_var + (1 - momentum) * float(
                (g - self._grad_mean).pow(2).sum())
            self._grad_mean.mul_(momentum).add_(g, alpha=1 - momentum)
        self._observed += 1
        comp = self.compression_variance()
        # (The variance needs two observations.)
        if (self._observed > max(warmup, 1) and comp > self.alarm_ratio * self._grad_var
                and self._warned_at != self.adaptations):
            self._warned_at = self.adaptations
            worst = sorted(self.tensors.values(), key=lambda t: -(t.sensitivity or 0.0)
                           * variance_factor(t.bits))[:3]
            names = ", ".join(f"{t.name} ({t.bits} bits)" for t in worst)
            warnings.warn(f"gnnact: compression variance {comp:.3g} exceeds {self.alarm_ratio}x "
                          f"the gradient's own variance {self._grad_var:.3g}; largest "
                          f"contributors: {names}. Raise avg_bits or the widths of these.",
                          RuntimeWarning, stacklevel=2)
        return {"gradient_variance": self._grad_var, "compression_variance": comp}

    # ------------------------------------------------------------------ reporting

    def report(self) -> list[dict]:
        """One row per compressed tensor: name, module, role, shape (of its first
        quantization), numel, sensitivity, bits, bytes."""
        rows = []
        for t in self.tensors.values():
            module = self.modules.get(t.module)
            owner = module.config if module is not None else (
                self.hooks.config if self.hooks is not None and t.name in self.hooks.tensors
                else self.scope.config)
            group = owner.group_size
            rows.append({"name": t.name, "module": t.module, "role": t.role,
                         "shape": t.shapes[0] if t.shapes else (), "numel": t.numel,
                         "sensitivity": t.sensitivity, "bits": t.bits,
                         "bytes": t.nbytes(group)})
        return rows

    def summary(self) -> str:
        """A plain-text table of :meth:`report`, with totals and the cost of the last
        estimate."""
        rows = self.report()
        lines = [f"{'tensor':32s} {'values':>12s} {'sensitivity':>12s} {'bits':>4s} "
                 f"{'bytes':>12s}"]
        for r in rows:
            c = "–" if r["sensitivity"] is None else f"{r['sensitivity']:.3e}"
            lines.append(f"{r['name']:32s} {r['numel']:12,d} {c:>12s} {r['bits']:4d} "
                         f"{r['bytes']:12,d}")
        values = sum(r["numel"] for r in rows)
        avg = sum(r["numel"] * r["bits"] for r in rows) / values if values else 0.0
        lines.append(f"{len(rows)} tensors, {values:,d} values, {avg:.2f} bits on average "
                     f"(budget {self.avg_bits:g}), {sum(r['bytes'] for r in rows):,d} bytes; "
                     f"last estimate: {self.last_passes} passes, {self.last_cost_s:.2f} s")
        return "\n".join(lines)
