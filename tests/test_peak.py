"""gnnact.peak.PeakMeter: the peak of tensor memory allocated inside a block, counted on the
CPU, read from the allocator on CUDA."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import torch
from torch_geometric.nn.models import GCN

import gnnact
from gnnact.peak import PeakMeter

MB = 1_000_000


def test_temporaries_are_freed_and_peak_is_the_most_alive_at_once():
    x = torch.randn(250_000)  # 1 MB, allocated before: not counted
    with PeakMeter() as meter:
        y = (x * 2).relu()  # x * 2 (1 MB) lives until relu's result (1 MB) exists
        for _ in range(5):
            (y + 1).sum()  # 1 MB each, freed at once
    assert meter.peak_bytes == 2 * MB + 4  # y + 1 next to y, and the sum's 4 bytes
    assert meter.end_bytes == MB
    del y


def test_views_in_place_ops_and_existing_storages_add_nothing():
    x = torch.randn(1000, 250)
    with PeakMeter() as meter:
        x.add_(1).mul_(2)
        v = x[10:].t().view(250, 990)
        v.relu_()
    assert (meter.peak_bytes, meter.end_bytes) == (0, 0)


def test_sparse_results_count_their_index_and_value_tensors():
    dense = torch.eye(1000)
    with PeakMeter() as meter:
        sparse = dense.to_sparse_coo()
    indices, values = sparse._indices(), sparse._values()
    assert meter.end_bytes == indices.nbytes + values.nbytes == 1000 * (16 + 4)


def test_backward_temporaries_and_gradients_are_counted():
    w = torch.randn(500, 500, requires_grad=True)  # 1 MB
    x = torch.randn(2000, 500)  # 4 MB
    with PeakMeter() as meter:
        (x @ w).relu().sum().backward()
    # Forward: x @ w (4 MB) until its relu (4 MB, kept for backward) exists; backward: the
    # relu's gradient (4 MB) next to the kept relu output, then w.grad (1 MB).
    assert 8 * MB <= meter.peak_bytes < 9 * MB
    assert meter.end_bytes == w.grad.nbytes


def test_end_of_forward_matches_the_independent_meter():
    """After a PyG model's forward, what the block still holds is the graph's saved storages
    plus the output: the shared tools' graph walk counts the same storages."""
    tools = Path(__file__).resolve().parents[2] / "shared" / "tools"
    if not (tools / "meter.py").is_file():
        pytest.skip(f"no independent meter at {tools}")
    sys.path.insert(0, str(tools))
    try:
        import meter as independent
    finally:
        sys.path.remove(str(tools))
    torch.manual_seed(0)
    x, edge_index = torch.randn(2000, 32), torch.randint(0, 2000, (2, 10_000))
    model = GCN(32, 64, 2, 7)
    model(x, edge_index)  # PyG caches nothing for GCN; a first call allocates nothing lasting
    with PeakMeter() as meter:
        out = model(x, edge_index)
    walked = independent.saved_storage_bytes(out.sum(), exclude=[x, *model.parameters()])
    assert meter.end_bytes == walked + out.nbytes - out.nbytes * _saves_output(out)


def _saves_output(out: torch.Tensor) -> bool:
    """Whether the last node keeps its own result (then the walk already counted it)."""
    return any(getattr(out.grad_fn, name, None) is out for name in dir(out.grad_fn)
               if name.startswith("_saved_"))


def test_a_converted_model_peaks_far_below_pyg():
    """A PyG GCN step against the same model converted to 2 bits, each metered: the
    converted step's peak is several times lower (bench figures: profile_peak.py)."""
    torch.manual_seed(0)
    x, edge_index = torch.randn(5000, 64), torch.randint(0, 5000, (2, 60_000))

    def peak(model: torch.nn.Module) -> int:
        opt = torch.optim.Adam(model.parameters())
        for metered in (False, True):
            with PeakMeter() if metered else _null() as meter:
                opt.zero_grad(set_to_none=True)
                model(x, edge_index).square().mean().backward()
                opt.step()
        return meter.peak_bytes

    pyg = peak(GCN(64, 128, 3, 10))
    ours = peak(gnnact.convert(GCN(64, 128, 3, 10), gnnact.Config(bits=2)))
    assert 0 < ours < pyg / 3


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


def test_threads_count_only_their_own_allocations():
    results = {}
    barrier = threading.Barrier(2)

    def work(name: str, numel: int) -> None:
        with PeakMeter() as meter:
            barrier.wait()
            kept = torch.ones(numel)
            barrier.wait()
        results[name] = (meter.peak_bytes, kept.nbytes)

    threads = [threading.Thread(target=work, args=("a", 1000)),
               threading.Thread(target=work, args=("b", 5000))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {"a": (4000, 4000), "b": (20000, 20000)}


def test_sites_say_what_was_alive_at_the_peak():
    x = torch.randn(1000, 100)
    with PeakMeter(sites=True) as meter:
        big = x.repeat(4, 1)  # 1.6 MB
        small = x[:10].clone()
        del big, small
    assert sum(meter.at_peak.values()) == meter.peak_bytes == 1_600_000 + 4_000
    first, nbytes = next(iter(meter.at_peak.items()))
    assert first.startswith("tests/test_peak.py:") and "aten.repeat" in first
    assert nbytes == 1_600_000


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="device must be 'cpu' or a CUDA device, got 'meta'"):
        PeakMeter("meta")
    with pytest.raises(ValueError, match="sites=True needs device 'cpu'"):
        PeakMeter("cuda", sites=True)


@pytest.mark.cuda
def test_cuda_reads_the_allocator():
    device = torch.device("cuda")
    x = torch.randn(1 << 20, device=device)
    with PeakMeter(device) as meter:
        y = x * 2
        del y
        z = x + 1
    assert meter.peak_bytes == 4 << 20 and meter.end_bytes == 4 << 20
    del z


# ----------------------------------------------------------------------------------------
# What the compressed ops allocate: each bound below is what one of them was changed to hold
# (full-size tensors of the layer's width; a block is 2 MiB, the tensors here 32-64 MiB).
# tests/test_aggregate_linear.py bounds the GCN and SAGE layers.

ROWS, WIDTH = 65_536, 128  # one tensor: 32 MiB of float32


def _metered_backward(out: torch.Tensor) -> PeakMeter:
    grad = torch.randn_like(out)
    with PeakMeter() as meter:
        out.backward(grad)
    return meter


def test_batch_norm_backward_restores_into_one_tensor():
    """BatchNorm's backward at 2 bits holds the restored input, normalised in place and then
    overwritten by the input gradient block by block: one full-size tensor, not also a centred
    copy, a product the size of the input or a separate gradient."""
    x = torch.randn(ROWS, WIDTH, requires_grad=True)
    weight, bias = torch.ones(WIDTH, requires_grad=True), torch.zeros(WIDTH, requires_grad=True)
    out = gnnact.ops.batch_norm(x, None, None, weight, bias, training=True,
                                config=gnnact.Config(bits=2))
    meter = _metered_backward(out)
    assert meter.peak_bytes < 1.15 * x.nbytes


def test_linear_backward_lets_the_restored_input_go_before_its_gradient():
    x = torch.randn(ROWS, WIDTH, requires_grad=True)
    w = torch.randn(WIDTH, WIDTH, requires_grad=True)
    out = gnnact.ops.linear(x, w, None, gnnact.Config(bits=2))
    meter = _metered_backward(out)
    assert meter.peak_bytes < 1.3 * x.nbytes


def test_dropout_backward_needs_no_float_copy_of_its_mask():
    x = torch.randn(ROWS, WIDTH, requires_grad=True)
    meter = _metered_backward(gnnact.ops.dropout(x, 0.5, training=True))
    # The gradient and one block of the mask (unpacked, and as floats): neither a float mask
    # (1.0) nor the whole boolean one (a quarter).
    assert meter.peak_bytes < 1.15 * x.nbytes


@pytest.mark.parametrize("op", ["relu", "leaky_relu", "dropout"])
def test_mask_op_forward_holds_its_output_and_packed_mask(op):
    """The output, the packed mask (1/32) and a block: no float draw (dropout: 1.0), and no
    whole boolean mask (a quarter) beside the output (dropout packs its draw first)."""
    x = torch.randn(ROWS, WIDTH, requires_grad=True)
    with PeakMeter() as meter:
        if op == "dropout":
            gnnact.ops.dropout(x, 0.5, training=True)
        else:
            getattr(gnnact.ops, op)(x)
    assert meter.peak_bytes < 1.15 * x.nbytes


@pytest.mark.parametrize("op", ["relu", "leaky_relu", "dropout", "elu"])
def test_in_place_mask_op_writes_over_its_input(op):
    """``inplace=True`` (``nn.ReLU(inplace=True)``, ``F.dropout(..., inplace=True)``) writes
    the result over the input, as PyTorch's does: no full-size output beside it, only the
    packed mask and a block (dropout: its boolean draw, a quarter; ELU: its sign, and its
    output at 2 bits); the same values and gradient as out of place."""
    base = torch.randn(ROWS, WIDTH, requires_grad=True)
    kwargs = {"p": 0.5, "training": True} if op == "dropout" else {}
    outs, grads = [], []
    for inplace in (False, True):
        x = base * 1.0  # a non-leaf, as an in-place op's input must be
        torch.manual_seed(0)
        with PeakMeter() as meter:
            out = getattr(gnnact.ops, op)(x, inplace=inplace, **kwargs)
        assert (out is x) == inplace
        if inplace:  # dropout's draw and ELU's sign are whole boolean masks (a quarter)
            assert meter.peak_bytes < (0.35 if op in ("dropout", "elu") else 0.15) * x.nbytes
        else:
            assert meter.peak_bytes > x.nbytes
        (grad,) = torch.autograd.grad(out, base, torch.ones_like(out))
        outs.append(out)
        grads.append(grad)
    assert torch.equal(outs[0], outs[1]) and torch.equal(grads[0], grads[1])


def test_gat_backward_restores_one_copy_of_its_input_at_a_time():
    """GAT's backward at 2 bits: the input gradient and one restored copy of the input (X^s,
    then the independently rounded X~^s once X^s is read no more), with one head's slices
    and per-edge values beside them: no head-major copies, no full-size products (they go
    into the gradient in place, or are summed by row blocks)."""
    heads, channels, n = 4, 64, ROWS // 4
    xs = torch.randn(n, heads, channels, requires_grad=True)
    att_src = torch.randn(1, heads, channels, requires_grad=True)
    att_dst = torch.randn(1, heads, channels, requires_grad=True)
    graph = gnnact.ops.graph_from(torch.randint(0, n, (2, 4 * n)), n, n)
    out = gnnact.ops.gat_attention(xs, None, att_src, att_dst, graph, training=True,
                                   config=gnnact.Config(bits=2))
    meter = _metered_backward(out)
    assert meter.peak_bytes < 3 * xs.nbytes  # (5.3 before)


def test_mean_aggregation_backward_scales_the_matrix_not_the_gradient():
    x = torch.randn(ROWS, WIDTH, requires_grad=True)
    edge_index = torch.randint(0, ROWS, (2, 4 * ROWS))
    graph = gnnact.ops.graph_from(edge_index, ROWS, ROWS, per_edge=False, keep_dst=False)
    out = gnnact.ops.spmm(x, graph, reduce="mean", config=gnnact.Config(bits=2))
    meter = _metered_backward(out)
    assert meter.peak_bytes < 1.3 * x.nbytes
