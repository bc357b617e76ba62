"""The generic saved-tensor pipeline on a CNN and a transformer: saved bytes, step time and
accuracy per compressor, against fp32.

Two parts, each a set of result rows in ``benchmarks/results/generic.jsonl``:

* ``bytes``: one training step per method on synthetic inputs larger than the tests' (a
  ResNet-18-style CNN, width 32, on 32 images of 3x32x32; a VGG-11-style CNN with four max
  pools on the same images; a 4-block transformer encoder, width 256 with 8 heads, on 16
  sequences of 128 tokens, with our blocks and with PyTorch's ``nn.TransformerEncoderLayer``
  and its dropouts): saved context (hook tallies; the fp32
  figure is the autograd-graph walk), median step time and, on a GPU, peak step memory, each
  with its ratio to fp32 measured side by side in the same run.
* ``digits``: full training on scikit-learn's bundled 8x8 digits (no download), test accuracy
  and final training loss, mean ± std over seeds, and the saved context of one 128-image
  step.

Methods: ``fp32`` (no hooks), ``quantize4``/``quantize2`` (per-group stochastic quantization on
every tensor), ``mesa`` (8 bits, head-wise, running ranges), ``division`` (8-block LFC in fp16 +
2-bit HFC), and ``default4``/``default2`` (the default policy: Mesa for attention maps, the loss
and the head exact, the rest quantized), and ``default2_wide_index``: ``default2`` with the
integer tensors (a max pool's argmax) and masks at their own width
(``Config(compact_indices=False)``).
Every compressed method keeps ReLU outputs as 1-bit masks.

Usage::

    python benchmarks/bench_generic.py [--parts bytes digits] [--device cuda] [--seeds 0 1 2]
        [--epochs 15] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
# The models are defined with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _common import RESULTS, environment, finish, median_time
from models_generic import VGG, ResNet18, TorchTransformer, Transformer, digits

from gnnact import Config, compress_saved_tensors
from gnnact.compress import OUTSIDE, Division, Mesa, Policy, Quantize, Rule
from gnnact.memory import saved_bytes

CNNS: dict[str, Callable[..., nn.Module]] = {"cnn": ResNet18, "vgg": VGG}
TRANSFORMERS: dict[str, Callable[..., nn.Module]] = {"transformer": Transformer,
                                                     "torch_transformer": TorchTransformer}
METHODS = ("fp32", "quantize4", "quantize2", "mesa", "division", "default4", "default2",
           "default2_wide_index")


def hooks_for(method: str, model: nn.Module, x: torch.Tensor) -> compress_saved_tensors | None:
    """The pipeline of ``method`` (``None`` for fp32): the loss stays exact in every one."""
    if method == "fp32":
        return None
    if method.startswith("default"):
        config = Config(bits=int(method[7]), compact_indices=not method.endswith("wide_index"))
        return compress_saved_tensors(config, model=model, skip=[x])
    compressor = {"quantize4": Quantize(4), "quantize2": Quantize(2), "mesa": Mesa(),
                  "division": Division()}[method]
    policy = Policy([Rule(None, names=(OUTSIDE,))], default=compressor)
    return compress_saved_tensors(Config(bits=4), model=model, skip=[x], policy=policy)


def loss_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
              hooks: compress_saved_tensors | None) -> torch.Tensor:
    if hooks is None:
        return F.cross_entropy(model(x), y)
    with hooks:
        return F.cross_entropy(model(x), y)


def synthetic(name: str, device: torch.device, smoke: bool
              ) -> tuple[Callable[[], nn.Module], torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    if name in CNNS:
        batch = 4 if smoke else 32
        x = torch.randn(batch, 3, 32, 32, generator=g)
        return lambda: CNNS[name](width=8 if smoke else 32), x.to(device), torch.randint(
            0, 10, (batch,), generator=g).to(device)
    batch, tokens = (4, 32) if smoke else (16, 128)
    x = torch.randn(batch, tokens, 32, generator=g)
    dim = 64 if smoke else 256
    return (lambda: TRANSFORMERS[name](tokens=tokens, features=32, dim=dim, heads=8, depth=4),
            x.to(device), torch.randint(0, 10, (batch,), generator=g).to(device))


def bytes_rows(args: argparse.Namespace, env: dict) -> list[dict]:
    rows = []
    cuda = args.device.type == "cuda"
    for name in args.models:
        make, x, y = synthetic(name, args.device, args.smoke)
        base: dict = {}
        for method in args.methods:
            torch.manual_seed(0)
            model = make().to(args.device)
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
            hooks = hooks_for(method, model, x)
            loss = loss_step(model, x, y, hooks)
            saved = (saved_bytes(loss, exclude=[model, x]) if hooks is None
                     else hooks.saved_bytes)
            loss.backward()

            def train_step(model=model, hooks=hooks, optimizer=optimizer, x=x, y=y) -> None:
                optimizer.zero_grad(set_to_none=True)
                loss_step(model, x, y, hooks).backward()
                optimizer.step()

            step_s = median_time(train_step, args.device, repeats=3 if args.smoke else 10)
            peak = None
            if cuda:
                torch.cuda.synchronize(args.device)
                torch.cuda.reset_peak_memory_stats(args.device)
                before = torch.cuda.memory_allocated(args.device)
                train_step()
                torch.cuda.synchronize(args.device)
                peak = torch.cuda.max_memory_allocated(args.device) - before
            if method == "fp32":
                base = {"saved": saved, "step": step_s, "peak": peak}
            row = {"bench": "generic", "part": "bytes", **env, "model": name, "method": method,
                   "input_shape": list(x.shape), "saved_bytes": saved,
                   "saved_ratio": base["saved"] / saved if base else None,
                   "step_ms": 1e3 * step_s,
                   "step_vs_fp32": step_s / base["step"] if base else None,
                   "peak_bytes": peak,
                   "peak_ratio": base["peak"] / peak if base and peak else None,
                   "bytes_by_kind": None if hooks is None else hooks.bytes_by_kind}
            rows.append(row)
            print(f"{name:12s} {method:10s} saved {saved / 1e6:8.2f} MB "
                  f"({row['saved_ratio'] or 1:5.2f}x)  step {1e3 * step_s:8.1f} ms "
                  f"({row['step_vs_fp32'] or 1:4.2f}x)", flush=True)
    return rows


def digits_rows(args: argparse.Namespace, env: dict) -> list[dict]:
    rows = []
    x, y, x_test, y_test = (t.to(args.device) for t in digits())
    epochs = 2 if args.smoke else args.epochs
    seeds = args.seeds[:1] if args.smoke else args.seeds
    for name in args.models:
        base_acc, base_saved = None, 0
        for method in args.methods:
            accs, losses, secs = [], [], []
            for seed in seeds:
                torch.manual_seed(seed)
                model = (CNNS[name](in_channels=1, width=16) if name in CNNS
                         else TRANSFORMERS[name]()).to(args.device)
                optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
                hooks = hooks_for(method, model, x)
                # The saved context of one 128-image step, before training.
                first = loss_step(model, x[:128], y[:128], hooks)
                saved = (saved_bytes(first, exclude=[model, x]) if hooks is None
                         else hooks.saved_bytes)
                del first
                start = time.perf_counter()
                for _epoch in range(epochs):
                    model.train()
                    order = torch.randperm(len(y), device=args.device)
                    epoch_losses = []
                    for i in range(0, len(y), 128):
                        idx = order[i:i + 128]
                        loss = loss_step(model, x[idx], y[idx], hooks)
                        optimizer.zero_grad(set_to_none=True)
                        loss.backward()
                        optimizer.step()
                        epoch_losses.append(loss.item())
                secs.append(time.perf_counter() - start)
                model.eval()
                with torch.no_grad():
                    accs.append(100 * (model(x_test).argmax(1) == y_test).float().mean().item())
                losses.append(statistics.mean(epoch_losses))
            mean = statistics.mean(accs)
            if method == "fp32":
                base_acc, base_saved = mean, saved
            row = {"bench": "generic", "part": "digits", **env, "model": name,
                   "method": method, "seeds": seeds, "epochs": epochs, "test_acc": accs,
                   "mean": mean, "std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                   "delta_vs_fp32": None if base_acc is None else mean - base_acc,
                   "saved_bytes": saved,
                   "saved_ratio": None if base_acc is None else base_saved / saved,
                   "final_train_loss": statistics.mean(losses),
                   "train_s": statistics.mean(secs)}
            rows.append(row)
            print(f"{name:12s} {method:10s} acc {mean:6.2f} ± {row['std']:4.2f}  final loss "
                  f"{row['final_train_loss']:.4f}  saved {saved / 1e6:.2f} MB", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=("bytes", "digits"),
                        default=["bytes", "digits"])
    parser.add_argument("--models", nargs="+", choices=(*CNNS, *TRANSFORMERS),
                        default=[*CNNS, *TRANSFORMERS])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--device", type=torch.device, default=torch.device("cpu"))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes; no rows written")
    parser.add_argument("--out", type=Path, default=RESULTS / "generic.jsonl")
    args = parser.parse_args(argv)
    if args.methods[0] != "fp32":  # ratios are against fp32, measured first in the same run
        args.methods = ["fp32", *[m for m in args.methods if m != "fp32"]]
    env = environment(args.device)
    rows = []
    if "bytes" in args.parts:
        rows += bytes_rows(args, env)
    if "digits" in args.parts:
        rows += digits_rows(args, env)
    return finish(args.out, rows, smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
