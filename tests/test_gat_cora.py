"""GAT's parameter gradients at 2 bits, and the GAT-on-Cora benchmark.

* unbiasedness of every parameter gradient of a converted ``GATConv`` at 2 bits (the attention
  vectors included: their gradient multiplies the edge scores' gradient, which reads the rounded
  features, by the features again, so one rounding used twice gives
  :math:`\\mathrm{Var}[\\hat X]`-sized bias);
* the same for the fused op with bipartite and source-only input;
* the byte cost of the independent copy;
* ``benchmarks/bench_gat_cora.py``: method parsing, a smoke run, the paired summary, and (when
  the shared datasets are there) one short run on Cora.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor
from torch_geometric.utils import add_self_loops, remove_self_loops

from gnnact.config import Config
from gnnact.memory import breakdown
from gnnact.nn.conv.gat_conv import GATConv
from gnnact.ops.gat import gat_attention
from gnnact.ops.graph import Graph
from gnnact.quant.packed import packed_code_bytes

pytestmark = [
    pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
    pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled"),
]

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
EXACT = Config(bits=32)
# Rounding noise of the features alone: the 8-bit attention coefficients add a bias of order
# Var[alpha^] ~ 4e-6 (documented in gnnact.ops.gat) that thousands of draws could resolve.
FEATURES_ONLY = Config(bits=2, attention_bits=32)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _assert_unbiased(samples: Tensor, exact: Tensor) -> None:
    r"""The mean of ``samples`` (``n`` draws) equals ``exact`` within its standard error.

    Per element, :math:`z_k = (\bar g_k - g^*_k)\sqrt n / \hat\sigma_k` is Student-t with
    :math:`n - 1` degrees of freedom when the estimator is unbiased: :math:`\max_k |z_k| < 5`
    (:math:`P(|t| > 5) \approx 10^{-6}` per element). Over the tensor,
    :math:`T = \|\bar g - g^*\|^2 / (\sum_k \hat\sigma_k^2 / n)` has mean 1 whatever the
    correlations between elements, and is at worst :math:`\chi^2_1` (fully correlated):
    :math:`T < 10` fails an unbiased estimator with probability below 0.2 %. The rounding
    bias of the attention vectors' gradients gave :math:`T \approx 20`-:math:`80` and
    :math:`\max |z| \approx 7`-:math:`15` here. Elements that no rounding reaches (a
    LeakyReLU-free softmax sums to a constant: its gradient is 0 up to float rounding) must
    match in absolute terms."""
    n = samples.size(0)
    mean, std = samples.mean(0), samples.std(0)
    noisy = std > 1e-6 * std.max()
    assert noisy.any()  # the test has power
    z = (mean - exact)[noisy] * math.sqrt(n) / std[noisy]
    t = float((mean - exact)[noisy].pow(2).sum() / std[noisy].pow(2).sum() * n)
    assert float(z.abs().max()) < 5.0, float(z.abs().max())
    assert t < 10.0, t
    scale = float(exact.abs().max())
    assert torch.allclose(mean[~noisy], exact[~noisy], rtol=0.0, atol=1e-9 * scale)


def _layer_grads(module: GATConv, x: Tensor, ei: Tensor, w: Tensor, config: Config,
                 seed: int) -> dict[str, Tensor]:
    module.config = config
    module.zero_grad()
    torch.manual_seed(seed)  # the rounding noise of every quantize() call
    (module(x, ei) * w).sum().backward()
    return {name: p.grad.clone() for name, p in module.named_parameters()}


def _layer() -> tuple[GATConv, Tensor, Tensor, Tensor]:
    n_nodes, f, c, heads = 24, 6, 4, 3
    g = _generator(1)
    x = torch.randn(n_nodes, f, generator=g, dtype=torch.float64)
    ei = torch.randint(0, n_nodes, (2, 96), generator=g)
    torch.manual_seed(0)
    module = GATConv(f, c, heads=heads).double().eval()  # eval: no dropout, grad mode on
    with torch.no_grad():  # attention vectors large enough for the scores to vary
        module.att_src.mul_(4)
        module.att_dst.mul_(4)
    w = torch.randn(n_nodes, heads * c, generator=_generator(3), dtype=torch.float64)
    return module, x, ei, w


def test_layer_parameter_gradients_unbiased_at_2_bits():
    """The mean of n = 400 seeded 2-bit gradients of every parameter (att_src, att_dst,
    lin.weight, bias) matches the exact gradient within its standard error."""
    module, x, ei, w = _layer()
    exact = _layer_grads(module, x, ei, w, EXACT, 0)
    draws = [_layer_grads(module, x, ei, w, FEATURES_ONLY, s) for s in range(400)]
    for name in ("att_src", "att_dst", "lin.weight"):
        _assert_unbiased(torch.stack([d[name] for d in draws]), exact[name])
    # The bias gets the output gradient, which reads no rounded value: exact in every draw.
    assert all(torch.allclose(d["bias"], exact["bias"]) for d in draws)


def _op_inputs(mode: str, seed: int = 0) -> tuple[Graph, Tensor, Tensor | None, Tensor,
                                                   Tensor, Tensor]:
    n_src, n_dst, heads, c = 20, 20 if mode == "same" else 14, 2, 4
    g = _generator(seed)
    ei = torch.stack([torch.randint(0, n_src, (80,), generator=g),
                      torch.randint(0, n_dst, (80,), generator=g)])
    if mode == "same":
        ei = add_self_loops(remove_self_loops(ei)[0], num_nodes=n_src)[0]
    graph = Graph.from_coo(ei[0], ei[1], n_src, n_dst)
    xs = torch.randn(n_src, heads, c, generator=g, dtype=torch.float64)
    xd = None if mode == "none" else (
        xs if mode == "same" else torch.randn(n_dst, heads, c, generator=g,
                                              dtype=torch.float64))
    att_s = 2 * torch.randn(1, heads, c, generator=g, dtype=torch.float64)
    att_d = 2 * torch.randn(1, heads, c, generator=g, dtype=torch.float64)
    w = torch.randn(n_dst, heads, c, generator=g, dtype=torch.float64)
    return graph, xs, xd, att_s, att_d, w


def _op_grads(mode: str, inputs: tuple, config: Config, seed: int) -> list[Tensor]:
    graph, xs, xd, att_s, att_d, w = inputs
    xs = xs.clone().requires_grad_()
    xd = xs if mode == "same" else (None if xd is None else xd.clone().requires_grad_())
    att_s, att_d = att_s.clone().requires_grad_(), att_d.clone().requires_grad_()
    torch.manual_seed(seed)
    (gat_attention(xs, xd, att_s, att_d, graph, config=config) * w).sum().backward()
    grads = [xs.grad, att_s.grad]
    if mode != "none":
        grads.append(att_d.grad)
    if mode == "separate":
        grads.append(xd.grad)
    return grads


@pytest.mark.parametrize("mode", ["same", "separate", "none"])
def test_op_gradients_unbiased_at_2_bits(mode):
    """The fused op on its own: one input (X^d is X^s), bipartite input (X^d kept separately)
    and no target term; every gradient unbiased (n = 400 draws)."""
    inputs = _op_inputs(mode)
    exact = _op_grads(mode, inputs, EXACT, 0)
    draws = [_op_grads(mode, inputs, FEATURES_ONLY, s) for s in range(400)]
    for k, e in enumerate(exact):
        _assert_unbiased(torch.stack([d[k] for d in draws]), e)


def _packed(n: int, bits: int, group: int = 512) -> int:
    g = min(group, n)
    return math.ceil(n / g) * (packed_code_bytes(g, bits) + 8)


def test_independent_copy_bytes():
    """What the op keeps: X^s twice at 2 bits (the second copy, rounded independently, only
    while an attention vector needs a gradient), alpha at 8 bits, the LeakyReLU mask."""
    graph, xs, _, att_s, att_d, _ = _op_inputs("same")
    n, heads, c = xs.shape
    e = graph.num_edges
    xs, att_s = xs.clone().requires_grad_(), att_s.clone().requires_grad_()
    inputs = [xs, att_s, att_d]  # (kept by reference, not context)
    rest = _packed(e * heads, 8) + math.ceil(e * heads / 8)
    out = gat_attention(xs, xs, att_s, att_d, graph, config=Config(bits=2))
    assert breakdown(out.sum(), exclude=inputs).context == 2 * _packed(n * heads * c, 2) + rest
    # Attention vectors frozen: nothing reads a second copy, and none is kept.
    out = gat_attention(xs, xs, att_s.detach(), att_d, graph, config=Config(bits=2))
    assert breakdown(out.sum(), exclude=inputs).context == _packed(n * heads * c, 2) + rest
    # 32 bits: X^s itself, once (excluded with the inputs), and alpha in float64.
    out = gat_attention(xs, xs, att_s, att_d, graph, config=EXACT)
    assert breakdown(out.sum(), exclude=inputs).context == e * heads * 8 + math.ceil(e * heads / 8)


# ------------------------------------------------------------------------ the benchmark


def _bench():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_gat_cora", BENCH / "bench_gat_cora.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_parse_method():
    bench = _bench()
    assert bench.parse_method("pyg") == (32, {})
    assert bench.parse_method("gnnact2") == (2, {})
    assert bench.parse_method("gnnact2:att=4,feat=32") == (2, {"att": 4, "feat": 32})
    for bad in ("gnnact", "fp16", "gnnact2:foo=3", "gnnact2:att=x"):
        with pytest.raises(ValueError):
            bench.parse_method(bad)


def test_bench_smoke_and_summary(tmp_path, capsys):
    bench = _bench()
    out = tmp_path / "rows.jsonl"
    assert bench.main(["--smoke", "--seeds", "0", "1", "--methods", "pyg", "gnnact2",
                       "gnnact2:feat=32,elu=32,conv1=32,att=4", "--rng", "matched",
                       "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| matched |  | gnnact2 | 2 |" in text and not out.exists()  # smoke: no rows
    rows = [{"bench": "gat_cora", "method": m, "seed": s, "rng": "shared", "tag": "",
             "test_acc": acc} for m, s, acc in
            [("pyg", 0, 80.0), ("pyg", 1, 82.0), ("pyg", 2, 81.0),
             ("gnnact2", 0, 79.0), ("gnnact2", 1, 81.5), ("gnnact2", 2, 80.0)]]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert bench.main(["--summary", "--out", str(out)]) == 0
    # paired differences -1, -0.5, -1: mean -0.83, s.e. 0.17
    assert "| shared |  | gnnact2 | 3 | 80.17 ± 1.26 | -0.83 ± 0.17 |" in capsys.readouterr().out


def test_bench_matched_rng_reproduces_pyg_masks(tmp_path):
    """With --rng matched, a 2-bit run draws PyG's dropout masks: the first forward pass
    equals PyG's, and the global generator ends in the same state."""
    bench = _bench()
    data = __import__("gnnact").data.synthetic_graph(200, 6, 12, 3, seed=0)
    outs, states = [], []
    for method in ("pyg", "gnnact2"):
        model = bench.build_model(data, method, seed=5)
        model.train()
        with bench.controlled_noise(5):
            out = model(data.x, data.edge_index)
            out.sum().backward()
        outs.append(out.detach())
        states.append(torch.get_rng_state())
    assert torch.allclose(outs[0], outs[1], atol=1e-5)
    assert torch.equal(states[0], states[1])


def test_bench_cora_one_epoch(tmp_path, shared_datasets):
    """One epoch on Cora's public split from the offline collection, both sides."""
    if not (shared_datasets / "planetoid" / "Cora" / "raw").is_dir():
        pytest.skip(f"no Cora in {shared_datasets}")
    bench = _bench()
    out = tmp_path / "rows.jsonl"
    assert bench.main(["--seeds", "0", "--epochs", "1", "--methods", "pyg", "gnnact2",
                       "--root", str(shared_datasets), "--out", str(out), "--tag", "test"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["method"] for r in rows] == ["pyg", "gnnact2"]
    for r in rows:
        assert r["dataset"] == "cora" and r["epochs"] == 1 and r["commit"] and r["date"]
        assert 0 <= r["test_acc"] <= 100 and r["settings"]["lr"] == 0.005
