r"""Real graph datasets by name, full-batch, prepared as the published baselines prepare them.

:func:`load_dataset` reads a dataset from ``root`` (the argument, else ``$GNNACT_DATA``, else
``~/.cache/gnnact/datasets``) through the dataset's own loader (OGB's
``PygNodePropPredDataset``, PyG's dataset classes), in the raw layout that loader expects
below ``root/<family>/``:

========================  ======================================  ==========================
names                     folder under ``root``                   preparation
========================  ======================================  ==========================
ogbn-arxiv                ``ogb/ogbn_arxiv/`` or ``ogbn_arxiv/``  undirected, OGB time split
ogbn-products             ``ogb/ogbn_products/`` (or without      OGB sales-ranking split
                          ``ogb/``, as OGB's own ``root``)
ogbn-proteins             ``ogb/ogbn_proteins/`` (likewise)       x = mean incoming edge
                                                                  features, 112 binary tasks
reddit                    ``reddit/raw/``                         PyG's split
reddit2, flickr, yelp     ``graphsaint/<name>/raw/``              GraphSAINT roles; features
                                                                  standardised (train stats)
cora, citeseer, pubmed    ``planetoid/<Name>/raw/``               row-normalised, public split
computers, photo          ``amazon/<Name>/raw/``                  row-normalised, random
                                                                  60/20/20 split (``seed``)
cs, physics               ``coauthor/<Name>/raw/``                as Amazon
dblp, cora_ml, …          ``citation_full/<name>/raw/``           as Amazon
roman-empire, tolokers, … ``heterophilous/<name>/raw/``           raw features, given split
                                                                  ``split`` of 10
========================  ======================================  ==========================

An OGB dataset is also found in OGB's own layout, ``root/ogbn_arxiv/`` (``root`` being the
``root`` given to OGB's ``PygNodePropPredDataset``). If both folders are there, the first of
``ogb/<name>/`` and ``<name>/`` that holds every raw file is loaded (``ogb/<name>/`` when both
do); if neither does, the first that exists is the one completed or reported.

Each dataset's ``Data`` carries ``metric``, how :func:`gnnact.training.evaluate` scores it:
``"acc"``; ``"rocauc"`` (mean ROC-AUC over tasks: ogbn-proteins's and Yelp's multi-label
targets, and the binary tolokers, minesweeper and questions, as Platonov et al. (2023) score
them); or, for OGB datasets, the OGB name (``"ogbn-arxiv"``), scored by OGB's own
``ogb.nodeproppred.Evaluator``.

The family folders match ``../shared/datasets`` and PyG's own ``root`` conventions, so one root
serves every loader. With every raw file present nothing touches the network. With a file
missing, :func:`load_dataset` downloads as the loader would when the source host answers
(never waiting for a prompt: OGB's "download 1.4 GB?" is answered yes, its "update the
dataset?" never asked); offline, or with ``download=False``, it raises
:class:`DatasetNotFoundError` within seconds, naming each missing file and its source.

PyG writes ``processed/`` next to ``raw/``: pass ``workdir=`` to load a copy of the dataset's
folder from there instead when ``root`` is read-only or shared.

A file that is there but cannot be read (truncated, garbage, an ``.npz`` holding pickled
objects) raises :class:`DatasetCorruptError`, naming the file and how to fetch it again.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import shutil
import socket
import urllib.parse
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data

__all__ = ["DATASETS", "DatasetCorruptError", "DatasetNotFoundError", "canonical_name",
           "data_root", "load_dataset", "random_split"]


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's raw files are missing and cannot be downloaded.

    Raised by :func:`load_dataset` when a raw file is missing and ``download=False``, or
    ``download=None`` and the source host does not answer within ``timeout`` seconds. The
    message names each missing file and where to get it. A subclass of
    :class:`FileNotFoundError`.

    Example:
        >>> import tempfile
        >>> from gnnact.data import DatasetNotFoundError, load_dataset
        >>> try:
        ...     load_dataset("cora", root=tempfile.mkdtemp(), download=False)
        ... except DatasetNotFoundError as error:
        ...     print(str(error).splitlines()[0])
        cora: 8 file(s) missing and download=False:
    """


class DatasetCorruptError(ValueError):
    """A dataset file is there but cannot be read: truncated, garbage, or not in its format
    (an ``.npz`` holding pickled objects, which the loaders refuse).

    Raised by :func:`load_dataset` when the dataset's loader fails and a raw file (or a file
    PyG wrote in ``processed/``) does not read as its format. The message names the file, why
    it is unreadable and how to fetch it again: delete it and load again with
    ``download=True``, which downloads it from the source named. A subclass of
    :class:`ValueError`.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from gnnact.data import DatasetCorruptError, load_dataset
        >>> root = Path(tempfile.mkdtemp())
        >>> raw = root / "heterophilous" / "tolokers" / "raw"
        >>> raw.mkdir(parents=True)
        >>> _ = (raw / "tolokers.npz").write_bytes(b"not a zip file")
        >>> try:
        ...     load_dataset("tolokers", root, download=False)
        ... except DatasetCorruptError as error:
        ...     print(str(error).split(" (")[0].replace(str(root), "<root>"))
        tolokers: <root>/heterophilous/tolokers/raw/tolokers.npz is corrupt or truncated
    """


@dataclass(frozen=True)
class _Spec:
    folder: str  # the dataset's folder under the root, the one ``workdir`` copies
    files: tuple[str, ...]  # raw files under ``folder``
    source: str  # where the files come from, for people
    probe: str  # the download host, asked whether we are online
    load: Callable[[Path, str], Data]  # (dataset folder, name) -> Data, by the real loader
    prepare: Callable[[Data, int, int], Data]  # (data, split, seed) -> Data with masks
    metric: str | None = None  # data.metric, when not "acc" ("rocauc" if y is [N, T])
    alternates: tuple[str, ...] = ()  # other folders it is found in, after ``folder``


# ------------------------------------------------------------------ preparation


def random_split(num_nodes: int, seed: int, train: float = 0.6,
                 val: float = 0.2) -> tuple[Tensor, Tensor, Tensor]:
    """Boolean train/val/test masks of a uniformly random ``train``/``val``/rest split, drawn
    from ``seed`` alone (the same split on every machine).

    A random permutation of the nodes gives its first ``int(train * num_nodes)`` nodes to
    training, the next ``int(val * num_nodes)`` to validation and the rest to test.

    Args:
        num_nodes (int): number of nodes :math:`N`.
        seed (int): seed of the permutation.
        train (float, optional): fraction of training nodes. (default: :obj:`0.6`)
        val (float, optional): fraction of validation nodes. (default: :obj:`0.2`)

    Returns:
        tuple[torch.Tensor, torch.Tensor, torch.Tensor]: the disjoint ``torch.bool`` masks
        ``(train_mask, val_mask, test_mask)``, each of shape ``[N]``, covering all nodes.

    Example:
        >>> from gnnact.data import random_split
        >>> train, val, test = random_split(10, seed=0)
        >>> int(train.sum()), int(val.sum()), int(test.sum())
        (6, 2, 2)
        >>> bool((train.int() + val.int() + test.int() == 1).all())
        True
    """
    perm = torch.randperm(num_nodes, generator=torch.Generator().manual_seed(seed))
    n_train, n_val = int(train * num_nodes), int(val * num_nodes)
    return _index_masks(num_nodes, {"train": perm[:n_train],
                                    "valid": perm[n_train:n_train + n_val],
                                    "test": perm[n_train + n_val:]})


def _row_normalize(x: Tensor) -> Tensor:
    # As torch_geometric.transforms.NormalizeFeatures (rows of binary bag-of-words sum to 1).
    return x / x.sum(dim=-1, keepdim=True).clamp(min=1.0)


def _standardize(x: Tensor, train_mask: Tensor) -> Tensor:
    # GraphSAINT's StandardScaler fitted on the training nodes (population std; constant
    # features are left centred, not divided by zero).
    train = x[train_mask].double()
    mean, std = train.mean(0), train.std(0, unbiased=False)
    std[std == 0] = 1.0
    return ((x.double() - mean) / std).to(x.dtype)


def _with_masks(data: Data, masks: tuple[Tensor, Tensor, Tensor]) -> Data:
    data.train_mask, data.val_mask, data.test_mask = masks
    return data


def _index_masks(num_nodes: int, split: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    masks = []
    for key in ("train", "valid", "test"):
        mask = torch.zeros(num_nodes, dtype=torch.bool)
        mask[split[key]] = True
        masks.append(mask)
    return masks[0], masks[1], masks[2]


def _keep(data: Data, split: int, seed: int) -> Data:
    return data


def _normalized_random(data: Data, split: int, seed: int) -> Data:
    data.x = _row_normalize(data.x.float())
    return _with_masks(data, random_split(data.num_nodes, seed))


def _normalized(data: Data, split: int, seed: int) -> Data:
    data.x = _row_normalize(data.x.float())
    return data


def _standardized(data: Data, split: int, seed: int) -> Data:
    data.x = _standardize(data.x.float(), data.train_mask)
    return data


def _given_split(data: Data, split: int, seed: int) -> Data:
    count = data.train_mask.size(1)
    if not 0 <= split < count:
        raise ValueError(f"split must be in [0, {count}) for this dataset, got {split}")
    return _with_masks(data, (data.train_mask[:, split].clone(), data.val_mask[:, split].clone(),
                              data.test_mask[:, split].clone()))


# ------------------------------------------------------------------ loaders


def _pyg(cls_name: str, arg: str | None) -> Callable[[Path, str], Data]:
    def load(folder: Path, name: str) -> Data:
        import torch_geometric.datasets as pyg_datasets

        # A class taking a name puts that dataset's folder below its root; one without is
        # rooted at the dataset's folder itself.
        cls = getattr(pyg_datasets, cls_name)
        dataset = cls(str(folder)) if arg is None else cls(str(folder.parent), arg)
        return dataset[0]

    return load


def _import_ogb(module: str, name: str):
    """``import ogb.<module>``, for dataset ``name``, with a clear error if ogb is absent."""
    import importlib

    # ogb starts a thread that asks PyPI whether ogb is outdated; keep it quiet offline.
    os.environ.setdefault("OUTDATED_IGNORE", "1")
    try:
        return importlib.import_module(f"ogb.{module}")
    except ImportError as error:
        raise ImportError(f"{name} needs the 'ogb' package: pip install 'gnnact[ogb]'") from error


def _ogb(folder: Path, name: str) -> Data:
    ogb_pyg = _import_ogb("nodeproppred.dataset_pyg", name)
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import GlobalStorage

    # Never wait for input: ogb asks before downloading more than 1 GB (the answer, having
    # been asked to load the dataset, is yes); its "updated, delete?" question cannot come up
    # because load_dataset has checked RELEASE_v1.txt.
    ask, ogb_pyg.decide_download = ogb_pyg.decide_download, lambda url: True
    # ogb 1.3.6 reads its processed file with torch.load's default, weights-only since torch
    # 2.6: allow PyG's data classes (plain containers) for that read.
    safe = [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage]
    try:
        with torch.serialization.safe_globals(safe):
            dataset = ogb_pyg.PygNodePropPredDataset(name, root=str(folder.parent))
            split = dataset.get_idx_split()
    finally:
        ogb_pyg.decide_download = ask
    data = dataset[0]
    data.ogb_split = split
    return data


def _ogb_arxiv(data: Data, split: int, seed: int) -> Data:
    from torch_geometric.utils import to_undirected

    # The OGB baselines symmetrise the citation graph (adj_t.to_symmetric()).
    data.edge_index = to_undirected(data.edge_index, num_nodes=data.num_nodes)
    return _ogb_common(data)


def _ogb_common(data: Data) -> Data:
    data.y = data.y.view(-1)
    split_idx = data.ogb_split
    del data.ogb_split
    if hasattr(data, "node_year"):
        del data.node_year
    return _with_masks(data, _index_masks(data.num_nodes, split_idx))


def _ogb_products(data: Data, split: int, seed: int) -> Data:
    return _ogb_common(data)


def _ogb_proteins(data: Data, split: int, seed: int) -> Data:
    from torch_geometric.utils import scatter

    # As the OGB baselines: node features are the mean of the incoming edges' features; the
    # 112 binary labels stay a float [N, 112] target (BCE, ROC-AUC).
    data.x = scatter(data.edge_attr, data.edge_index[1], 0, dim_size=data.num_nodes,
                     reduce="mean")
    del data.edge_attr
    labels = data.y.float()
    data = _ogb_common(data)
    data.y = labels
    if hasattr(data, "node_species"):
        del data.node_species
    return data


_OGB_SOURCE = "http://snap.stanford.edu/ogb/data/nodeproppred/{}.zip (unzip as {})"
_OGB_HOST = "http://snap.stanford.edu"
# PyG downloads Planetoid, Amazon, Coauthor, CitationFull and the heterophilous graphs from
# GitHub-hosted raw files.
_GITHUB_RAW = "https://raw.githubusercontent.com"
_SAINT_FILES = ("adj_full.npz", "feats.npy", "class_map.json", "role.json")
_SAINT_SOURCE = ("the GraphSAINT data (https://github.com/GraphSAINT/GraphSAINT, Google Drive "
                 "folder '{}'), as PyG's {} class downloads it")


def _ogb_spec(name: str, raw: tuple[str, ...], split: str,
              prepare: Callable[[Data, int, int], Data]) -> _Spec:
    plain = name.replace("-", "_")  # OGB's own folder below its root
    folder = "ogb/" + plain
    files = ("RELEASE_v1.txt", *(f"raw/{f}.csv.gz" for f in raw),
             *(f"split/{split}/{part}.csv.gz" for part in ("train", "valid", "test")))
    short = name.split("-")[1]
    return _Spec(folder, files, _OGB_SOURCE.format(short, folder), _OGB_HOST, _ogb, prepare,
                 metric=name, alternates=(plain,))


def _planetoid(name: str) -> _Spec:
    parts = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
    return _Spec(f"planetoid/{name}", tuple(f"raw/ind.{name.lower()}.{p}" for p in parts),
                 "https://github.com/kimiyoung/planetoid/raw/master/data", _GITHUB_RAW,
                 _pyg("Planetoid", name), _normalized)


def _npz(family: str, cls: str, name: str, file: str, prepare,
         metric: str | None = None) -> _Spec:
    return _Spec(f"{family}/{name}", (f"raw/{file}",),
                 f"PyG's {cls}('{name}') download", _GITHUB_RAW, _pyg(cls, name), prepare,
                 metric=metric)


_BINARY = ("minesweeper", "tolokers", "questions")

DATASETS: dict[str, _Spec] = {
    "ogbn-arxiv": _ogb_spec("ogbn-arxiv", ("edge", "node-feat", "node-label", "node_year",
                                           "num-node-list", "num-edge-list"),
                            "time", _ogb_arxiv),
    "ogbn-products": _ogb_spec("ogbn-products", ("edge", "node-feat", "node-label",
                                                 "num-node-list", "num-edge-list"),
                               "sales_ranking", _ogb_products),
    "ogbn-proteins": _ogb_spec("ogbn-proteins", ("edge", "edge-feat", "node-label",
                                                 "node_species", "num-node-list",
                                                 "num-edge-list"),
                               "species", _ogb_proteins),
    "reddit": _Spec("reddit", ("raw/reddit_data.npz", "raw/reddit_graph.npz"),
                    "https://data.dgl.ai/dataset/reddit.zip", "https://data.dgl.ai",
                    _pyg("Reddit", None), _keep),
    **{name: _Spec(f"graphsaint/{name}", tuple(f"raw/{f}" for f in _SAINT_FILES),
                   _SAINT_SOURCE.format(name, cls), "https://drive.google.com", _pyg(cls, None),
                   _standardized)
       for name, cls in (("reddit2", "Reddit2"), ("flickr", "Flickr"), ("yelp", "Yelp"))},
    **{name.lower(): _planetoid(name) for name in ("Cora", "CiteSeer", "PubMed")},
    "computers": _npz("amazon", "Amazon", "Computers", "amazon_electronics_computers.npz",
                      _normalized_random),
    "photo": _npz("amazon", "Amazon", "Photo", "amazon_electronics_photo.npz",
                  _normalized_random),
    "cs": _npz("coauthor", "Coauthor", "CS", "ms_academic_cs.npz", _normalized_random),
    "physics": _npz("coauthor", "Coauthor", "Physics", "ms_academic_phy.npz",
                    _normalized_random),
    # CitationFull's Cora, CiteSeer and PubMed are bigger graphs than Planetoid's.
    **{key: _npz("citation_full", "CitationFull", name, f"{name}.npz", _normalized_random)
       for key, name in (("cora_full", "cora"), ("cora_ml", "cora_ml"),
                         ("citeseer_full", "citeseer"), ("dblp", "dblp"),
                         ("pubmed_full", "pubmed"))},
    # The binary ones are scored by ROC-AUC, as in Platonov et al. (2023).
    **{name: _npz("heterophilous", "HeterophilousGraphDataset", name, f"{name}.npz",
                  _given_split, metric="rocauc" if name in _BINARY else None)
       for name in ("roman_empire", "amazon_ratings", "minesweeper", "tolokers", "questions")},
}

_ALIASES = {"arxiv": "ogbn-arxiv", "products": "ogbn-products", "proteins": "ogbn-proteins",
            "amazon-computers": "computers", "amazon-photo": "photo", "coauthor-cs": "cs",
            "coauthor-physics": "physics"}


def canonical_name(name: str) -> str:
    """The key of :data:`DATASETS` that ``name`` means (case-insensitive; aliases such as
    ``arxiv`` and ``amazon-computers`` accepted).

    Args:
        name (str): a dataset name or alias.

    Returns:
        str: the key of :data:`DATASETS`.

    Raises:
        ValueError: ``name`` is no dataset gnnact knows; the message lists those it does.

    Example:
        >>> from gnnact.data import canonical_name
        >>> canonical_name("Amazon-Computers"), canonical_name("arxiv")
        ('computers', 'ogbn-arxiv')
    """
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in DATASETS:
        key = key.replace("-", "_")
    if key not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(sorted(DATASETS))}")
    return key


# ------------------------------------------------------------------ entry point


def data_root(root: str | os.PathLike | None = None) -> Path:
    """``root``, else ``$GNNACT_DATA``, else ``~/.cache/gnnact/datasets``: the datasets root of
    :func:`load_dataset`.

    Args:
        root (str or os.PathLike, optional): an explicit root. (default: :obj:`None`)

    Returns:
        pathlib.Path: the root (not checked for existence).

    Example:
        >>> from gnnact.data import data_root
        >>> str(data_root("/data/graphs"))
        '/data/graphs'
    """
    if root is not None:
        return Path(root)
    env = os.environ.get("GNNACT_DATA")
    return Path(env) if env else Path.home() / ".cache" / "gnnact" / "datasets"


def _reachable(url: str, timeout: float) -> bool:
    parsed = urllib.parse.urlparse(url)
    if not parsed.hostname:
        return False
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _folder(spec: _Spec, base: Path) -> str:
    # gnnact's layout first, then the alternates (OGB's own): the first holding every raw
    # file, else the first that exists (to complete or report), else gnnact's.
    folders = (spec.folder, *spec.alternates)
    for folder in folders:
        if all((base / folder / f).is_file() for f in spec.files):
            return folder
    return next((folder for folder in folders if (base / folder).is_dir()), spec.folder)


def _read_fully(path: Path) -> None:
    """Read ``path`` as its format says (by name), to the end; raise if it does not parse."""
    name = path.name
    if name.endswith(".npz"):
        if not zipfile.is_zipfile(path):  # else numpy's error is about pickles
            raise zipfile.BadZipFile("not a zip archive, as an .npz file is")
        # As the PyG loaders read them: no pickled objects.
        with np.load(path, allow_pickle=False) as archive:
            for key in archive.files:
                archive[key]
    elif name.endswith(".npy"):
        np.load(path, allow_pickle=False)
    elif name.endswith(".json"):
        json.loads(path.read_text())
    elif name.endswith(".gz"):
        with gzip.open(path) as stream:
            while stream.read(1 << 24):
                pass
    elif name.endswith(".pt"):  # torch.save's zip container, as PyG writes processed/
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
        if bad is not None:
            raise zipfile.BadZipFile(f"bad CRC in member {bad}")
    elif name.endswith(".index"):  # Planetoid's test.index: one integer a line
        [int(v) for v in path.read_text().split()]
    elif name.startswith("ind."):  # Planetoid's Python 2 pickles, read as PyG reads them
        with open(path, "rb") as f:
            pickle.load(f, encoding="latin1")


def _unreadable(folder: Path, spec: _Spec) -> tuple[Path, str] | None:
    """The first of the dataset's files under ``folder`` (raw ones, then ``processed/*.pt``)
    that does not read as its format, with why; :obj:`None` if all read."""
    paths = [folder / f for f in spec.files]
    paths += sorted((folder / "processed").glob("*.pt"))
    for path in paths:
        try:
            _read_fully(path)
        except Exception as error:  # any failure to parse is the file's fault here
            return path, f"{type(error).__name__}: {error}"
    return None


def _load_checked(spec: _Spec, key: str, folder: Path, original: Path) -> Data:
    """``spec.load``, turning a failure caused by an unreadable file into a
    :class:`DatasetCorruptError` that names it (under ``original``, the folder below
    ``root``, when ``folder`` is the ``workdir`` copy)."""
    try:
        return spec.load(folder, key)
    except ImportError:
        raise
    except Exception as error:
        # Only on failure: reading every file again is as slow as loading them.
        found = _unreadable(folder, spec)
        if found is None:
            raise
        path, why = found
        relative = path.relative_to(folder)
        where = original / relative
        copy = f" and its copy {path}" if folder != original else ""
        if relative.parts[0] == "processed":
            fix = "it is rebuilt from raw/ on the next load"
        else:
            fix = (f"load again with download=True to fetch it again from {spec.source}, "
                   f"or put a good copy there")
        raise DatasetCorruptError(
            f"{key}: {where} is corrupt or truncated ({why}). Delete it{copy}; {fix}."
        ) from error


def load_dataset(name: str, root: str | os.PathLike | None = None, *, split: int = 0,
                 seed: int = 0, download: bool | None = None,
                 workdir: str | os.PathLike | None = None, timeout: float = 3.0) -> Data:
    r"""Load dataset ``name`` as one full-batch :class:`~torch_geometric.data.Data` with
    ``x``, ``y``, ``edge_index`` and boolean ``train_mask``/``val_mask``/``test_mask``.

    Args:
        name (str): a key of :data:`DATASETS` (case-insensitive; ``arxiv``, ``products``,
            ``amazon-computers``, … are accepted too).
        root (str or Path, optional): the datasets root (see :func:`data_root`).
            (default: :obj:`None`, ``$GNNACT_DATA`` or ``~/.cache/gnnact/datasets``)
        split (int, optional): which of the given splits, for datasets with several
            (heterophilous graphs: 10). (default: :obj:`0`)
        seed (int, optional): seed of the random 60/20/20 split of datasets without a
            standard one (Amazon, Coauthor, CitationFull). (default: :obj:`0`)
        download (bool, optional): :obj:`False`: never download; :obj:`True`: download
            missing files; :obj:`None`: download if the source host answers within
            ``timeout`` seconds. (default: :obj:`None`)
        workdir (str or Path, optional): copy the dataset's folder (without its
            ``processed/`` cache) below this directory first (once) and load the copy,
            leaving ``root`` untouched. (default: :obj:`None`)
        timeout (float, optional): seconds to wait for the source host. (default: :obj:`3.0`)

    Returns:
        torch_geometric.data.Data: ``x`` (:math:`[N, F]`), ``y`` (:math:`[N]`, or
        :math:`[N, T]` for the multi-label ogbn-proteins and Yelp), ``edge_index``
        (:math:`[2, |E|]`), the three boolean masks (:math:`[N]`) and ``metric`` (a string:
        how :func:`gnnact.training.evaluate` scores it, see above).

    Raises:
        DatasetNotFoundError: files are missing and cannot be downloaded.
        DatasetCorruptError: a file is there but truncated or not in its format.
        ValueError: unknown ``name`` or ``split``.

    Example:
        >>> import tempfile
        >>> from gnnact.data import load_dataset
        >>> data = load_dataset("cora", root="../shared/datasets", download=False,
        ...                     workdir=tempfile.mkdtemp())  # root read-only: load a copy
        >>> data.num_nodes, data.num_features, int(data.train_mask.sum())
        (2708, 1433, 140)
    """
    key = canonical_name(name)
    spec = DATASETS[key]
    base = data_root(root)
    folder = _folder(spec, base)
    missing = [path for path in (base / folder / f for f in spec.files)
               if not path.is_file()]
    offline = download is False or (
        download is None and missing and not _reachable(spec.probe, timeout))
    if missing and offline:
        listing = "\n  ".join(map(str, missing))
        why = "download=False" if download is False else "the source is unreachable"
        raise DatasetNotFoundError(
            f"{key}: {len(missing)} file(s) missing and {why}:\n  {listing}\n"
            f"Put them there from {spec.source} (datasets/README.md says how), or set "
            f"root= / GNNACT_DATA to a folder that has them.")
    original = base / folder
    if workdir is not None:
        copy = Path(workdir) / folder
        if not copy.exists() and original.is_dir():
            # Without processed/: a cache beside raw/ may come from another PyG version
            # (the shared collection carries one); this one rebuilds it from the raw files.
            shutil.copytree(original, copy, ignore=shutil.ignore_patterns("processed"))
        base = Path(workdir)
    data = spec.prepare(_load_checked(spec, key, base / folder, original), split, seed)
    data.metric = spec.metric or ("rocauc" if data.y.dim() == 2 else "acc")
    return data
