"""Step time at every size: PyG fp32 against ``gnnact.convert(model)``, eager and compiled,
measured side by side.

Cases: every family of the fidelity suite (:mod:`fidelity_models`: its model, data and
training recipe as its users write them), and the ``gcn`` family's model (PyG's
``examples/gcn.py``) on CiteSeer, Amazon Computers, Coauthor Physics and an ogbn-arxiv-shaped
synthetic graph (the family itself is Cora). Variants:

- ``pyg``: the model as written, fp32;
- ``gnnact``: ``gnnact.convert(model)`` with the default ``Config()`` (automatic widths);
- with ``--compile``, ``pyg_compiled`` and ``gnnact_compiled``: the same under
  ``torch.compile``;
- with ``--fixed2``, ``gnnact_fixed2``: ``convert(model, Config(bits=2, self_check=False))``,
  the fixed width that automatic precision is held to (issue "accuracy at the default":
  its steady step ≤ 1.15× of this one; ``ratio_fixed2`` on the ``gnnact`` row).

The variants take turns: ``--rounds`` rounds, each a burst of about ``--steps`` training steps
of every variant in turn, through the family's own loop (forward, loss, backward, optimizer
step; a step is timed from the model's first call to the end of the optimizer's step, so the
recipe's evaluation is not), so that a neighbour that slows the machine slows every variant
alike. The first round is a warm-up (compilation, the first noise probes of the automatic
widths: it runs at least :data:`WARMUP_STEPS` steps, whatever ``--steps`` is) and is not
counted; a row's ``step_ms`` is the median of the other rounds' steps,
``ratio`` its quotient by ``pyg``'s (``ratio_compiled``: a compiled variant's by
``pyg_compiled``'s; ``ratio_fixed2``: ``gnnact``'s by ``gnnact_fixed2``'s); a converted
variant's ``as_pytorch`` and ``context_bytes`` say whether its last step ran as PyTorch's
(``gnnact.nn.scope.PassRecord``) and what it kept. Targets (issue
"speed parity"): ``gnnact`` / ``pyg`` ≤ 1.1 on the CPU, ``gnnact_compiled`` /
``pyg_compiled`` ≤ 1.0, ≤ 1.0 on a GPU.

Usage::

    python benchmarks/bench_speed.py [--cases gcn gat gcn-physics] [--compile] [--fixed2]
        [--rounds 4] [--steps 10] [--device cpu] [--threads 2] [--smoke]

Rows are appended to ``benchmarks/results/speed.jsonl`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch_geometric import seed_everything

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, append_rows, data_root, environment
from bench_fidelity import StepMeter, steps_of
from fidelity_models import FAMILIES, Family, _named, _planetoid, clone, load

import gnnact
from gnnact.data import synthetic_like
from gnnact.nn.scope import PassRecord, scope_of


def _arxiv_shape(root: Path, workdir: str, seed: int):
    return synthetic_like("arxiv", seed=seed)


#: The ``gcn`` family's model and recipe on other graphs, from small to the arxiv shape.
_GCN_ON = {"citeseer": ("CiteSeer", _planetoid("CiteSeer")),
           "computers": ("Amazon Computers", _named("computers")),
           "physics": ("Coauthor Physics", _named("physics")),
           "arxiv": ("ogbn-arxiv shape (synthetic)", _arxiv_shape)}

CASES: dict[str, Family] = {
    **FAMILIES,
    **{f"gcn-{key}": dataclasses.replace(FAMILIES["gcn"], name=f"gcn-{key}", load=loader,
                                         dataset=dataset)
       for key, (dataset, loader) in _GCN_ON.items()},
}

VARIANTS = ("pyg", "gnnact", "pyg_compiled", "gnnact_compiled", "gnnact_fixed2")
FIXED2 = gnnact.Config(bits=2, self_check=False)

#: Compiled entries per code object (Dynamo's ``recompile_limit``, 8 by default) while the
#: benchmark runs: room for every variant's.
RECOMPILE_LIMIT = 64

#: Steps of the warm-up round at least: through the probe at step 16 of the automatic widths'
#: doubling schedule (steps 1, 2, 4, 8, 16: :meth:`gnnact.adaptive.auto.AutoPrecision.schedule`),
#: after which a probe comes once in 16 steps or fewer. Counted, five probes in ten steps
#: would time the probes, not the steady step.
WARMUP_STEPS = 17


def make_variant(base: nn.Module, variant: str,
                 compiled: Callable[[nn.Module], nn.Module] = torch.compile) -> nn.Module:
    """A copy of ``base`` (same weights) as ``variant`` runs it (``compiled``: what compiles a
    model, the family's)."""
    model = clone(base)
    if variant.startswith("gnnact"):
        gnnact.convert(model, FIXED2 if variant == "gnnact_fixed2" else None)
    return compiled(model) if variant.endswith("_compiled") else model


def _last_pass(model: nn.Module) -> PassRecord | None:
    """What the last training step of a converted ``model`` (compiled or not) kept."""
    scope = scope_of(getattr(model, "_orig_mod", model))
    return None if scope is None else scope.last


def time_case(family: Family, variants: list[str], rounds: int, steps: int, seed: int,
              root: Path, device: torch.device, workdir: str,
              warmup_steps: int = WARMUP_STEPS) -> list[dict]:
    """One row per variant: the median step time of its rounds after the first."""
    data = load(family, root, seed, workdir, device)
    torch.manual_seed(seed)
    base = family.build(data).to(device)
    # The family's loop runs epochs: as many as make about `steps` steps (a batched family's
    # epoch is several).
    per_epoch = steps_of(family, data, 1)
    epochs = max(1, round(steps / per_epoch))
    warmup = max(epochs, math.ceil(warmup_steps / per_epoch))
    models = {v: make_variant(base, v, family.compiled) for v in variants}
    times: dict[str, list[float]] = {v: [] for v in variants}
    errors: dict[str, str] = {}
    for r in range(rounds):
        for v in variants:
            if v in errors:
                continue
            meter = StepMeter(models[v], -1, data, device)  # (-1: no context measured)
            seed_everything(1000 + r)
            try:
                family.train(models[v], data, epochs if r else warmup, meter)
            except Exception as error:  # (a variant that fails gets its row)
                errors[v] = f"{type(error).__name__}: {error}"[:300]
            finally:
                meter.close()
            if r:  # the first round warms up
                times[v] += [1e3 * t for t in meter.times]
    median = {v: statistics.median(t) for v, t in times.items() if t}
    rows = []
    for v in variants:
        last = _last_pass(models[v])
        row = {"case": family.name, "dataset": family.dataset, "variant": v, "seed": seed,
               "rounds": rounds, "epochs_per_round": epochs, "warmup_epochs": warmup,
               "steps": len(times[v]),
               "step_ms": median.get(v), "ratio": None, "ratio_compiled": None,
               "ratio_fixed2": None,
               # What a converted model's last step did: ran as PyTorch's, and kept.
               "as_pytorch": None if last is None else last.as_pytorch,
               "context_bytes": None if last is None else last.context,
               "error": errors.get(v), "threads": torch.get_num_threads(),
               **environment(device)}
        if v in median and "pyg" in median:
            row["ratio"] = median[v] / median["pyg"]
        if v.endswith("_compiled") and v in median and "pyg_compiled" in median:
            row["ratio_compiled"] = median[v] / median["pyg_compiled"]
        if v == "gnnact" and v in median and "gnnact_fixed2" in median:
            row["ratio_fixed2"] = median[v] / median["gnnact_fixed2"]
        rows.append(row)
        step = f"{median[v]:9.2f} ms" if v in median else errors.get(v, "no steps")[:60]
        ratio = f"{row['ratio']:.2f}x" if row["ratio"] is not None else ""
        print(f"{family.name:16s} {v:16s} {step}  {ratio}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--compile", action="store_true", help="the compiled variants too")
    parser.add_argument("--fixed2", action="store_true",
                        help="gnnact at a fixed 2 bits too (automatic widths' reference)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="steps per variant per round")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "speed.jsonl")
    parser.add_argument("--smoke", action="store_true",
                        help="two rounds of one step, no result file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.rounds < 2:
        parser.error(f"--rounds must be at least 2 (the first warms up), got {args.rounds}")
    rounds, steps = (2, 1) if args.smoke else (args.rounds, args.steps)
    variants = list(VARIANTS[:4] if args.compile else VARIANTS[:2])
    if args.fixed2:
        variants.append("gnnact_fixed2")
    count = 0
    # The compiled variants share code objects (PyG's layer forwards), and Dynamo keeps one
    # cache of compiled entries per code object: a deep model's layers (DeeperGCN's
    # DeepGCNLayer, one entry per instance) filled the default 8 with the first variant's,
    # and the other ran those frames eagerly.
    with (torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT),
          tempfile.TemporaryDirectory() as workdir):
        for name in args.cases:
            # Each case compiles afresh: the families share model classes, and guards of an
            # earlier case's graphs would count against Dynamo's recompilation limit here.
            torch._dynamo.reset()
            rows = time_case(CASES[name], variants, rounds, steps, args.seed, data_root(),
                             torch.device(args.device), workdir,
                             warmup_steps=0 if args.smoke else WARMUP_STEPS)
            if not args.smoke:  # case by case: a long run cut short keeps what it measured
                append_rows(args.out, rows)
            count += len(rows)
    if not args.smoke:
        print(f"{count} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
