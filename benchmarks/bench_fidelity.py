"""Accuracy at the default: each model family of :mod:`fidelity_models`, written and trained
as its users do, in PyG fp32 against ``gnnact.convert(model)`` with no config (automatic
widths), on paired seeds, with the memory and the time of each.

Per (family, seed) the model is built once; fp32 trains it, and each gnnact configuration
trains a converted copy of the same initial weights, every run under the same seeds of
torch, numpy and ``random`` (PyG's negative sampling draws from the last two; gnnact draws its
rounding noise from generators of its own, so the dropout masks and every other random draw
of the recipe are fp32's). Configurations:

- ``pyg``: the model as written, fp32;
- ``auto``: ``gnnact.convert(model)``, the default ``Config()``;
- ``fixed2``: ``gnnact.Config(bits=2, self_check=False)``, the fixed width the automatic one
  is timed against;
- ``fixed8``: ``gnnact.Config(bits=8, self_check=False)``, a control (not run by default): a
  rounding too fine to cost accuracy, so its paired differences are what any perturbation of
  the run moves the metric by on those seeds. A family whose default differs from fp32 by
  about as much as its ``fixed8`` does needs more seeds, not more bits.

Each row: the family's metric (test accuracy at the best validation epoch, or ROC AUC), the
final training loss, the context kept at the last training step (:func:`gnnact.memory.
saved_bytes` of the loss, gnnact's graph cache included, the input data excluded: it lives
anyway, as do a step's own inputs, its batch or GAE's negative pairs), the bytes of the last
probe's alternate copies (``probe_bytes``), the average bits of the compressed values, and
step times: ``step_ms`` the median of all training steps, ``mean_step_ms`` their mean
(probe steps included), ``first_step_ms`` the first step, and ``probe_step_ms`` the mean of
the probe steps. The summary pairs each seed's gnnact run with
its fp32 run (targets: within 0.5 points, context ≥ 10× below fp32, steady step ≤ 1.15× of
``fixed2``).

Usage::

    python benchmarks/bench_fidelity.py [--families gcn gat] [--seeds 0 1 2]
        [--configs pyg auto fixed2 fixed8] [--quick] [--device cpu] [--out results/fidelity.jsonl]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import Tensor, nn
from torch_geometric import seed_everything

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, append_rows, data_root, environment
from fidelity_models import FAMILIES, Family, Meter, clone, data_tensors, load

import gnnact
from gnnact.memory import saved_bytes
from gnnact.nn.scope import scope_of

CONFIGS = {
    "pyg": None,
    "auto": gnnact.Config(),
    "fixed2": gnnact.Config(bits=2, self_check=False),
    "fixed8": gnnact.Config(bits=8, self_check=False),
}
#: What runs without ``--configs`` (``fixed8`` is a control, run where a family asks for it).
DEFAULT_CONFIGS = ["pyg", "auto", "fixed2"]


class StepMeter(Meter):
    """Times each training step, from the first module call after the last step to the end
    of the optimizer's step, and measures the context of the last one."""

    def __init__(self, model: nn.Module, steps: int, data: object, device: torch.device
                 ) -> None:
        self.model, self.steps, self.device = model, steps, device
        self.inputs = data_tensors(data)
        self.times: list[float] = []
        self.context: int | None = None
        self._start: float | None = None
        self._count = 0
        self._paused = 0.0
        modules = [model, *model.children()]
        self._handles = [m.register_forward_pre_hook(self._begin) for m in modules]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _begin(self, module: nn.Module, args: tuple) -> None:
        if self._start is None and module.training and torch.is_grad_enabled():
            self._sync()
            self._start = time.perf_counter()

    def forward(self, loss: Tensor, inputs: tuple[Tensor, ...] = ()) -> None:
        self._count += 1
        if self._count == self.steps:  # the last step: what it keeps, at the final widths
            begin = time.perf_counter()
            self.context = saved_bytes(loss, exclude=[*self.inputs, *inputs])
            self._paused = time.perf_counter() - begin

    def step(self) -> None:
        self._sync()
        if self._start is not None:
            self.times.append(time.perf_counter() - self._start - self._paused)
        self._start, self._paused = None, 0.0

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def steps_of(family: Family, data: object, epochs: int) -> int:
    """Training steps of ``epochs``: one an epoch, or one a batch."""
    if isinstance(data, dict):  # graph classification: batches of 64
        return epochs * -(-len(data["train"]) // 64)
    return epochs


def run(family: Family, seed: int, configs: list[str], epochs: int, root: Path,
        device: torch.device, workdir: str) -> list[dict]:
    data = load(family, root, seed, workdir, device)
    torch.manual_seed(seed)
    base = family.build(data).to(device)
    rows = []
    for name in configs:
        model = clone(base)
        if CONFIGS[name] is not None:
            gnnact.convert(model, CONFIGS[name])
        steps = steps_of(family, data, epochs)
        meter = StepMeter(model, steps, data, device)
        seed_everything(1000 + seed)  # the same dropout masks and samples in every run
        begin = time.perf_counter()
        metric, loss = family.train(model, data, epochs, meter)
        seconds = time.perf_counter() - begin
        meter.close()
        scope = scope_of(model)
        auto = scope.auto if scope is not None else None
        times = [1e3 * t for t in meter.times]
        probes = set(auto.schedule(len(times))) if auto is not None and auto.adapt else set()
        probe_times = [t for i, t in enumerate(times) if i in probes]
        rows.append({
            "family": family.name, "dataset": family.dataset, "seed": seed, "config": name,
            "metric": family.metric, "value": metric, "final_loss": loss, "epochs": epochs,
            "steps": len(times), "context_bytes": meter.context,
            "probe_bytes": auto.probe_bytes if auto is not None else 0,
            "avg_bits": auto.average_bits if auto is not None else None,
            "over_budget": auto.over_budget if auto is not None else None,
            "widths": ({t.name: t.bits for t in auto.tensors.values()}
                       if auto is not None and auto.adapt else None),
            "step_ms": statistics.median(times), "mean_step_ms": statistics.fmean(times),
            "steady_step_ms": statistics.fmean(times[len(times) // 2:]),
            "first_step_ms": times[0],
            "probe_step_ms": statistics.fmean(probe_times) if probe_times else None,
            "seconds": seconds, "threads": torch.get_num_threads(), **environment(device)})
        print(f"{family.name:12s} seed {seed} {name:7s} {family.metric} {100 * metric:6.2f} "
              f"loss {loss:8.4f} context {meter.context or 0:>12,d} B  step "
              f"{rows[-1]['step_ms']:8.2f} ms  ({seconds:.0f} s)", flush=True)
    return rows


def summarize(rows: list[dict]) -> str:
    """Per family and configuration: the metric's mean, the paired difference to fp32 (mean
    and standard deviation over seeds), the context ratio and the step time ratios."""
    lines = [f"{'family':12s} {'config':7s} {'metric':>8s} {'vs fp32':>14s} {'context':>9s} "
             f"{'step/fixed2':>11s} {'first/fixed2':>12s} {'bits':>5s}"]
    by = {(r["family"], r["seed"], r["config"]): r for r in rows}
    families = list(dict.fromkeys(r["family"] for r in rows))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    for fam in families:
        seeds = sorted({r["seed"] for r in rows if r["family"] == fam})
        for cfg in configs:
            mine = [by[(fam, s, cfg)] for s in seeds if (fam, s, cfg) in by]
            if not mine:
                continue
            value = statistics.fmean(100 * r["value"] for r in mine)
            diffs = [100 * (by[(fam, r["seed"], cfg)]["value"] - by[(fam, r["seed"], "pyg")]
                            ["value"]) for r in mine if (fam, r["seed"], "pyg") in by]
            diff = (f"{statistics.fmean(diffs):+6.2f}±{statistics.pstdev(diffs):4.2f}"
                    if diffs and cfg != "pyg" else "")
            ratios = [by[(fam, r["seed"], "pyg")]["context_bytes"] / r["context_bytes"]
                      for r in mine if (fam, r["seed"], "pyg") in by and r["context_bytes"]]
            context = f"{statistics.fmean(ratios):7.1f}x" if ratios and cfg != "pyg" else ""
            step = first = ""
            fixed = [by.get((fam, r["seed"], "fixed2")) for r in mine]
            if cfg == "auto" and all(fixed):
                step = f"{statistics.fmean(r['steady_step_ms'] / f['steady_step_ms'] for r, f in zip(mine, fixed, strict=True)):10.2f}x"  # noqa: E501
                first = f"{statistics.fmean(r['first_step_ms'] / f['first_step_ms'] for r, f in zip(mine, fixed, strict=True)):11.2f}x"  # noqa: E501
            bits = [r["avg_bits"] for r in mine if r["avg_bits"] is not None]
            avg = f"{statistics.fmean(bits):5.2f}" if bits else ""
            lines.append(f"{fam:12s} {cfg:7s} {value:8.2f} {diff:>14s} {context:>9s} "
                         f"{step:>11s} {first:>12s} {avg:>5s}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(DEFAULT_CONFIGS))
    parser.add_argument("--quick", action="store_true",
                        help="the CI slice's epochs (each family's quick_epochs)")
    parser.add_argument("--epochs", type=int, default=None, help="override every family's")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "fidelity.jsonl")
    parser.add_argument("--smoke", action="store_true", help="write no rows")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if "pyg" not in args.configs:
        args.configs.insert(0, "pyg")
    device = torch.device(args.device)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.families:
            family = FAMILIES[name]
            epochs = args.epochs or (family.quick_epochs if args.quick else family.epochs)
            for seed in args.seeds:
                new = run(family, seed, args.configs, epochs, data_root(), device, workdir)
                if not args.smoke:  # row by row: a long run cut short keeps what it measured
                    append_rows(args.out, new)
                rows += new
    print(summarize(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
