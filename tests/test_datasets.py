"""gnnact.data.load_dataset: fixtures in the real OGB and GraphSAINT raw layouts loaded through
the real loaders, the offline error, corrupt files, OGB's Evaluator, and the datasets of
../shared/datasets."""

from __future__ import annotations

import gzip
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from gnnact.data import (
    DATASETS,
    DatasetCorruptError,
    DatasetNotFoundError,
    datasets,
    load_dataset,
    random_split,
)
from gnnact.training import evaluate, metric_of


def _csv_gz(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for row in rows:
            f.write(",".join(str(v) for v in np.atleast_1d(row)) + "\n")


def _ogb_arxiv_fixture(root: Path, n: int = 12, f: int = 5, folder: str = "ogb/ogbn_arxiv",
                       seed: int = 0) -> dict:
    """A tiny graph in ogbn-arxiv's exact layout: ``ogb/ogbn_arxiv/{RELEASE_v1.txt, raw/*.csv.gz,
    split/time/*.csv.gz}`` (directed citation edges, float features, int labels, years), or
    below ``folder`` (``ogbn_arxiv``: OGB's own layout below its ``root``)."""
    gen = np.random.default_rng(seed)
    folder = root / folder
    edges = np.array([(i, (i + 1) % n) for i in range(n)] + [(0, 5), (3, 9)])
    feats = gen.standard_normal((n, f)).round(6)
    labels = gen.integers(0, 3, n)
    _csv_gz(folder / "raw" / "edge.csv.gz", edges)
    _csv_gz(folder / "raw" / "node-feat.csv.gz", feats)
    _csv_gz(folder / "raw" / "node-label.csv.gz", labels)
    _csv_gz(folder / "raw" / "node_year.csv.gz", gen.integers(2010, 2020, n))
    _csv_gz(folder / "raw" / "num-node-list.csv.gz", [n])
    _csv_gz(folder / "raw" / "num-edge-list.csv.gz", [len(edges)])
    split = {"train": range(0, 6), "valid": range(6, 9), "test": range(9, n)}
    for part, idx in split.items():
        _csv_gz(folder / "split" / "time" / f"{part}.csv.gz", list(idx))
    (folder / "RELEASE_v1.txt").write_text("# Release note for ogbn-arxiv\n")
    return {"edges": edges, "feats": feats, "labels": labels, "split": split}


def test_ogb_arxiv_layout_through_ogb_loader(tmp_path):
    pytest.importorskip("ogb")
    fx = _ogb_arxiv_fixture(tmp_path)
    data = load_dataset("ogbn-arxiv", tmp_path, download=False)
    n = len(fx["labels"])
    torch.testing.assert_close(data.x, torch.tensor(fx["feats"], dtype=torch.float32))
    assert data.y.tolist() == fx["labels"].tolist()  # [N, 1] in OGB, flattened
    # Made undirected, as the OGB baselines do: every edge in both directions, once.
    pairs = {tuple(e) for e in data.edge_index.t().tolist()}
    expected = {(int(a), int(b)) for a, b in fx["edges"]} | {(int(b), int(a))
                                                          for a, b in fx["edges"]}
    assert pairs == expected and data.edge_index.size(1) == len(expected)
    for key, part in (("train_mask", "train"), ("val_mask", "valid"), ("test_mask", "test")):
        assert torch.nonzero(getattr(data, key)).view(-1).tolist() == list(fx["split"][part])
    assert data.num_nodes == n and not hasattr(data, "node_year")
    # A second load reads OGB's processed file (weights-only torch.load) and gives the same.
    again = load_dataset("arxiv", tmp_path, download=False)
    assert torch.equal(again.edge_index, data.edge_index) and torch.equal(again.x, data.x)


def test_ogb_missing_release_file_is_reported_not_prompted(tmp_path):
    pytest.importorskip("ogb")
    _ogb_arxiv_fixture(tmp_path)
    (tmp_path / "ogb" / "ogbn_arxiv" / "RELEASE_v1.txt").unlink()
    with pytest.raises(DatasetNotFoundError, match="RELEASE_v1.txt"):
        load_dataset("ogbn-arxiv", tmp_path, download=False)


def _graphsaint_fixture(folder: Path, n: int = 10, f: int = 4) -> dict:
    """GraphSAINT's layout: ``raw/{adj_full.npz, feats.npy, class_map.json, role.json}``."""
    gen = np.random.default_rng(1)
    raw = folder / "raw"
    raw.mkdir(parents=True)
    row = np.arange(n)
    col = (row + 1) % n
    adj = sp.coo_matrix((np.ones(2 * n), (np.r_[row, col], np.r_[col, row])), shape=(n, n))
    adj = adj.tocsr()
    np.savez(raw / "adj_full.npz", data=adj.data, indices=adj.indices, indptr=adj.indptr,
             shape=np.array(adj.shape))
    feats = gen.standard_normal((n, f)).astype(np.float32) * 3 + 1
    np.save(raw / "feats.npy", feats)
    labels = gen.integers(0, 3, n)
    (raw / "class_map.json").write_text(json.dumps({str(i): int(c) for i, c in
                                                    enumerate(labels)}))
    role = {"tr": list(range(6)), "va": [6, 7], "te": [8, 9]}
    (raw / "role.json").write_text(json.dumps(role))
    return {"feats": feats, "labels": labels, "role": role, "adj": adj}


def test_graphsaint_layout_through_pyg_loader(tmp_path):
    fx = _graphsaint_fixture(tmp_path / "graphsaint" / "flickr")
    data = load_dataset("flickr", tmp_path, download=False)
    assert data.y.tolist() == fx["labels"].tolist()
    assert data.edge_index.size(1) == fx["adj"].nnz
    assert torch.nonzero(data.train_mask).view(-1).tolist() == fx["role"]["tr"]
    assert torch.nonzero(data.test_mask).view(-1).tolist() == fx["role"]["te"]
    # GraphSAINT standardises features with the training nodes' mean and std.
    train = torch.tensor(fx["feats"][fx["role"]["tr"]], dtype=torch.float64)
    expected = (torch.tensor(fx["feats"], dtype=torch.float64) - train.mean(0)) / \
        train.std(0, unbiased=False)
    torch.testing.assert_close(data.x, expected.float())
    torch.testing.assert_close(data.x[data.train_mask].mean(0), torch.zeros(4),
                               atol=1e-5, rtol=0)


def test_offline_missing_files_fail_fast_naming_paths(tmp_path, monkeypatch):
    # Every source at an unroutable address (TEST-NET-1): offline in every environment.
    reachable = datasets._reachable
    monkeypatch.setattr(datasets, "_reachable",
                        lambda url, timeout: reachable("http://192.0.2.1/", timeout))
    for name in ("ogbn-products", "reddit", "yelp", "computers"):
        start = time.perf_counter()
        with pytest.raises(DatasetNotFoundError) as info:
            load_dataset(name, tmp_path, download=None, timeout=1.0)
        assert time.perf_counter() - start < 5.0
        spec = DATASETS[name]
        assert str(tmp_path / spec.folder / spec.files[0]) in str(info.value)
        assert "unreachable" in str(info.value)
    with pytest.raises(DatasetNotFoundError, match="download=False"):
        load_dataset("cora", tmp_path, download=False)


def test_bad_names_and_splits(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset 'ogbn-mag'"):
        load_dataset("ogbn-mag", tmp_path)
    with pytest.raises(ValueError, match="tolokers"):
        load_dataset("tolokerz", tmp_path)


def test_random_split_deterministic_and_disjoint():
    a, b = random_split(101, seed=3), random_split(101, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert int(sum(m.int() for m in a).max()) == 1 and int(sum(m.sum() for m in a)) == 101
    assert [int(m.sum()) for m in a] == [60, 20, 21]
    assert not torch.equal(a[0], random_split(101, seed=4)[0])


def test_ogb_plain_layout_loads(tmp_path):
    """OGB's own layout, ``<root>/ogbn_arxiv`` as ``PygNodePropPredDataset(root=<root>)``
    writes it, loads as ``<root>/ogb/ogbn_arxiv`` does, with ``workdir`` too."""
    pytest.importorskip("ogb")
    fx = _ogb_arxiv_fixture(tmp_path / "root", folder="ogbn_arxiv")
    data = load_dataset("ogbn-arxiv", tmp_path / "root", download=False,
                        workdir=tmp_path / "work")
    assert data.y.tolist() == fx["labels"].tolist()
    torch.testing.assert_close(data.x, torch.tensor(fx["feats"], dtype=torch.float32))
    assert (tmp_path / "work" / "ogbn_arxiv" / "processed").is_dir()
    assert not (tmp_path / "root" / "ogb").exists()
    assert not (tmp_path / "root" / "ogbn_arxiv" / "processed").exists()


def test_ogb_both_layouts_complete_one_first_gnnact_before_ogb(tmp_path):
    pytest.importorskip("ogb")
    ours = _ogb_arxiv_fixture(tmp_path, seed=0)
    plain = _ogb_arxiv_fixture(tmp_path, folder="ogbn_arxiv", seed=1)
    assert ours["labels"].tolist() != plain["labels"].tolist()
    assert load_dataset("arxiv", tmp_path, download=False).y.tolist() == ours["labels"].tolist()
    # gnnact's folder incomplete: OGB's complete one is loaded rather than reported missing.
    (tmp_path / "ogb" / "ogbn_arxiv" / "raw" / "edge.csv.gz").unlink()
    assert load_dataset("arxiv", tmp_path, download=False).y.tolist() == plain["labels"].tolist()


def test_ogb_plain_layout_missing_file_reported_in_that_folder(tmp_path):
    _ogb_arxiv_fixture(tmp_path, folder="ogbn_arxiv")
    (tmp_path / "ogbn_arxiv" / "split" / "time" / "test.csv.gz").unlink()
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("ogbn-arxiv", tmp_path, download=False)
    assert str(tmp_path / "ogbn_arxiv" / "split" / "time" / "test.csv.gz") in str(info.value)


class _Linear(torch.nn.Module):
    """A linear model on the features, called as the training loop calls models."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.lin = torch.nn.Linear(in_channels, out_channels)

    def forward(self, x, adj):
        return self.lin(x)


def test_ogb_dataset_scored_by_ogb_evaluator(tmp_path):
    ogb_nodeproppred = pytest.importorskip("ogb.nodeproppred")
    _ogb_arxiv_fixture(tmp_path, n=40)
    data = load_dataset("ogbn-arxiv", tmp_path, download=False)
    assert data.metric == "ogbn-arxiv"
    torch.manual_seed(0)
    model = _Linear(data.num_features, 3)
    out = model(data.x, None)
    evaluator = ogb_nodeproppred.Evaluator("ogbn-arxiv")
    expected = [evaluator.eval({"y_true": data.y[mask].view(-1, 1),
                                "y_pred": out[mask].argmax(-1, keepdim=True)})["acc"]
                for mask in (data.val_mask, data.test_mask)]
    assert 0.0 < expected[1] < 1.0
    assert list(evaluate(model, data)) == expected


def test_ogb_rocauc_evaluator_and_nan_without_both_classes():
    ogb_nodeproppred = pytest.importorskip("ogb.nodeproppred")
    from torch_geometric.data import Data

    gen = torch.Generator().manual_seed(0)
    y = torch.randint(0, 2, (60, 112), generator=gen)
    out = torch.randn(60, 112, generator=gen).round(decimals=1)  # with ties
    score = metric_of(Data(y=y, metric="ogbn-proteins"))
    expected = ogb_nodeproppred.Evaluator("ogbn-proteins").eval({"y_true": y, "y_pred": out})
    assert score(out, y) == pytest.approx(expected["rocauc"], abs=1e-12)
    assert np.isnan(score(out, torch.zeros_like(y)))  # OGB raises; gnnact reports NaN


def test_ogb_metric_without_ogb_is_a_clear_error(monkeypatch):
    from torch_geometric.data import Data

    monkeypatch.setitem(__import__("sys").modules, "ogb.nodeproppred", None)
    with pytest.raises(ImportError, match=r"pip install 'gnnact\[ogb\]'"):
        metric_of(Data(y=torch.zeros(3, dtype=torch.long), metric="ogbn-arxiv"))


# ------------------------------------------------------------------ corrupt files


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garbage(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(np.random.default_rng(0).bytes(300))


def _npz_truncated(root: Path, request=None) -> Path:
    path = root / "heterophilous" / "tolokers" / "raw" / "tolokers.npz"
    path.parent.mkdir(parents=True)
    np.savez(path, node_features=np.ones((50, 4)), node_labels=np.zeros(50),
             edges=np.zeros((10, 2), dtype=np.int64))
    _truncate(path)
    return path


def _npz_garbage(root: Path, request=None) -> Path:
    path = root / "amazon" / "Computers" / "raw" / "amazon_electronics_computers.npz"
    _garbage(path)
    return path


def _npz_pickled(root: Path, request=None) -> Path:
    # The upstream key layout, with an object array the loaders refuse to unpickle.
    path = root / "coauthor" / "CS" / "raw" / "ms_academic_cs.npz"
    path.parent.mkdir(parents=True)
    np.savez(path, attr_data=np.array([{"not": "an array"}], dtype=object),
             attr_indices=np.zeros(1, dtype=np.int64), attr_indptr=np.array([0, 1]),
             attr_shape=np.array([1, 1]))
    return path


def _planetoid_truncated(root: Path, request) -> Path:
    shared = request.getfixturevalue("shared_datasets")
    # raw/ only: the collection may carry a processed/ cache, which PyG would read instead.
    shutil.copytree(shared / "planetoid" / "Cora" / "raw", root / "planetoid" / "Cora" / "raw")
    path = root / "planetoid" / "Cora" / "raw" / "ind.cora.graph"
    _truncate(path)
    return path


def _ogb_csv_truncated(root: Path, request=None) -> Path:
    pytest.importorskip("ogb")
    _ogb_arxiv_fixture(root)
    path = root / "ogb" / "ogbn_arxiv" / "raw" / "node-feat.csv.gz"
    _truncate(path)
    return path


def _ogb_csv_garbage(root: Path, request=None) -> Path:
    pytest.importorskip("ogb")
    _ogb_arxiv_fixture(root, folder="ogbn_arxiv")
    path = root / "ogbn_arxiv" / "split" / "time" / "train.csv.gz"
    _garbage(path)
    return path


def _saint_json_garbage(root: Path, request=None) -> Path:
    _graphsaint_fixture(root / "graphsaint" / "flickr")
    path = root / "graphsaint" / "flickr" / "raw" / "class_map.json"
    path.write_text('{"0": 1, "1": ')
    return path


def _saint_npy_truncated(root: Path, request=None) -> Path:
    _graphsaint_fixture(root / "graphsaint" / "flickr")
    path = root / "graphsaint" / "flickr" / "raw" / "feats.npy"
    _truncate(path)
    return path


CORRUPT = {"tolokers": _npz_truncated, "computers": _npz_garbage, "cs": _npz_pickled,
           "cora": _planetoid_truncated, "ogbn-arxiv": _ogb_csv_truncated,
           "arxiv": _ogb_csv_garbage, "flickr": _saint_json_garbage,
           "Flickr": _saint_npy_truncated}


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_corrupt_file_named_with_how_to_fetch_it(name, tmp_path, request):
    path = CORRUPT[name](tmp_path, request)
    with pytest.raises(DatasetCorruptError) as info:
        load_dataset(name, tmp_path, download=False)
    message = str(info.value)
    spec = DATASETS[datasets.canonical_name(name)]
    assert isinstance(info.value, ValueError)
    assert f"{path} is corrupt or truncated" in message
    assert "Delete it" in message and "download=True" in message and spec.source in message


def test_corrupt_file_in_workdir_copy_names_both(tmp_path):
    path = _npz_truncated(tmp_path / "root")
    with pytest.raises(DatasetCorruptError) as info:
        load_dataset("tolokers", tmp_path / "root", download=False, workdir=tmp_path / "work")
    copy = tmp_path / "work" / "heterophilous" / "tolokers" / "raw" / "tolokers.npz"
    assert f"{path} is corrupt" in str(info.value) and f"its copy {copy}" in str(info.value)


def test_truncated_processed_file_is_named_and_rebuilt(tmp_path):
    _graphsaint_fixture(tmp_path / "graphsaint" / "flickr")
    first = load_dataset("flickr", tmp_path, download=False)
    processed = tmp_path / "graphsaint" / "flickr" / "processed" / "data.pt"
    _truncate(processed)
    with pytest.raises(DatasetCorruptError, match="rebuilt from raw/") as info:
        load_dataset("flickr", tmp_path, download=False)
    assert f"{processed} is corrupt" in str(info.value)
    processed.unlink()  # as the message says
    assert torch.equal(load_dataset("flickr", tmp_path, download=False).x, first.x)


def test_unknown_metric_is_refused():
    from torch_geometric.data import Data

    with pytest.raises(ValueError, match="data.metric .* got 'f1'"):
        metric_of(Data(y=torch.zeros(3, dtype=torch.long), metric="f1"))


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in folder.rglob("*")}


def test_workdir_copy_rebuilds_processed_files(tmp_path):
    # A processed/ cache beside raw/ may come from another PyG version: the copy leaves it.
    root = tmp_path / "root"
    _graphsaint_fixture(root / "graphsaint" / "flickr")
    first = load_dataset("flickr", root, download=False)
    _truncate(root / "graphsaint" / "flickr" / "processed" / "data.pt")
    copy = load_dataset("flickr", root, download=False, workdir=tmp_path / "work")
    assert torch.equal(copy.x, first.x)
    assert (tmp_path / "work" / "graphsaint" / "flickr" / "processed" / "data.pt").is_file()


# Counts as documented in ../shared/datasets/README.md (PyG-style directed edge counts).
SHARED_COUNTS = {
    "cora": (2708, 10556, 1433, 7), "citeseer": (3327, 9104, 3703, 6),
    "computers": (13752, 491722, 767, 10), "photo": (7650, 238162, 745, 8),
    "cs": (18333, 163788, 6805, 15),
    "dblp": (17716, 105734, 1639, 4), "cora_ml": (2995, 16316, 2879, 7),
    "citeseer_full": (4230, 10674, 602, 6), "tolokers": (11758, 1038000, 10, 2),
    "minesweeper": (10000, 78804, 7, 2),
}


@pytest.mark.parametrize("name", sorted(SHARED_COUNTS))
def test_shared_datasets(name, shared_datasets, tmp_path):
    before = _listing(shared_datasets / DATASETS[name].folder)
    data = load_dataset(name, shared_datasets, workdir=tmp_path, download=False)
    nodes, edges, features, classes = SHARED_COUNTS[name]
    assert (data.num_nodes, data.num_edges, data.num_features) == (nodes, edges, features)
    assert int(data.y.max()) + 1 == classes
    masks = torch.stack([data.train_mask, data.val_mask, data.test_mask])
    assert masks.dtype == torch.bool and int(masks.int().sum(0).max()) == 1
    if name in ("cora", "citeseer"):  # the public split
        assert int(data.train_mask.sum()) == 20 * classes and int(data.test_mask.sum()) == 1000
    if name not in ("tolokers", "minesweeper"):  # row-normalised bag of words
        sums = data.x.sum(-1)
        assert torch.allclose(sums[sums > 0], torch.ones(()), atol=1e-5)
    assert _listing(shared_datasets / DATASETS[name].folder) == before  # root untouched
    assert data.metric == ("rocauc" if name in ("tolokers", "minesweeper") else "acc")
