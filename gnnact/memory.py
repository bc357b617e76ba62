r"""Count the bytes an autograd graph keeps alive for the backward pass.

This is the device-independent memory measure of the project (see ``DESIGN.md`` §4): walk
the autograd graph from the output(s) and sum the *distinct storages* that its nodes hold for
backward. Let :math:`\mathcal{N}` be the nodes reachable from the outputs through
``next_functions``, :math:`T(v)` the tensors node :math:`v` keeps, and :math:`S(t)` the
storages of tensor :math:`t`. Then

.. math::
    \text{saved\_bytes} = \sum_{s \in \mathcal{S} \setminus \mathcal{X}} \text{nbytes}(s),
    \qquad \mathcal{S} = \bigcup_{v \in \mathcal{N}} \bigcup_{t \in T(v)} S(t),

where :math:`\mathcal{X}` holds the excluded storages: those of the graph leaves (unless
``include_leaves=True``) and those of the tensors and modules passed as ``exclude``.

* :math:`T(v)` for a built-in node: every ``_saved_*`` attribute that is a tensor, or a
  tuple/list of tensors. For a custom :class:`torch.autograd.Function` node: its
  ``saved_tensors`` and every tensor, :class:`~gnnact.quant.packed.PackedTensor` or
  :class:`~gnnact.quant.packed.PackedMask` stored as a ``ctx`` attribute (also inside
  tuples, lists and dicts), and the tensors of a :class:`~gnnact.ops.graph.Graph` it holds:
  gnnact's **graph cache** (the CSR structure its aggregations keep for backward, built once
  per adjacency), counted like any other storage and reported as its own line by
  :func:`breakdown`.
* A tensor saved under :func:`torch.autograd.graph.saved_tensors_hooks` is read in its
  packed form, without calling the unpack hook (``_raw_saved_*``): for gnnact's own pipeline
  (:class:`gnnact.compress_saved_tensors`, the scope of a converted model) that is the
  compressed copy, counted by the storages of its parts (``tensors()``; offloaded items by
  their host buffers).
* :math:`S(t)` for a strided tensor is its whole ``untyped_storage()`` (a view keeps all of
  its base alive); for a sparse tensor, the storages of its index and value tensors; for a
  traceable wrapper subclass (PyG's :class:`~torch_geometric.EdgeIndex` and
  :class:`~torch_geometric.Index`, nested tensors), the storages of its inner tensors plus the
  tensors it caches as attributes (``EdgeIndex`` caches its transpose outside
  ``__tensor_flatten__``). Meta tensors and empty storages count 0.
* Two storages are the same when their device and ``data_ptr()`` agree, so a tensor saved by
  several nodes (a ReLU output that the next linear layer also saves) counts once.

What a graph walk cannot see: what other saved-tensor hooks pack into objects that are neither
tensors nor gnnact's packed forms (non-reentrant checkpointing keeps a handle and recomputes),
and anything held outside the graph. Measure those by allocator or RSS instead.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import BackwardCFunction
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from gnnact.quant.packed import PackedMask, PackedTensor

__all__ = ["SavedBytes", "SavedRecord", "argument_tensors", "breakdown", "saved_bytes",
           "saved_tensors", "storage_key", "storage_keys", "tensor_storages"]

#: Storage identity: ``(device type, device index, data pointer)``.
StorageKey = tuple[str, int | None, int]


def storage_key(storage: torch.UntypedStorage) -> StorageKey:
    """The identity of ``storage``, the key :func:`storage_keys` and :func:`tensor_storages`
    give it.

    Args:
        storage (torch.UntypedStorage): a tensor's storage (``t.untyped_storage()``).

    Returns:
        tuple[str, int or None, int]: ``(device type, device index, data pointer)``.

    Example:
        >>> from gnnact.memory import storage_key
        >>> x = torch.randn(10, 4)
        >>> storage_key(x[2:].untyped_storage()) == storage_key(x.untyped_storage())
        True
    """
    device = storage.device
    return (device.type, device.index, storage.data_ptr())

_FREED_MESSAGE = (
    "the saved tensors of this autograd graph were already freed by a backward pass; call "
    "saved_bytes/saved_tensors before backward, or use retain_graph=True"
)

_PACKED_TYPES = (PackedTensor, PackedMask)

# The node type of graph leaves (checked by type: a custom ctx may well have a `variable`).
_AccumulateGrad = torch._C._functions.AccumulateGrad

_SPARSE_PARTS = {
    torch.sparse_coo: ("_indices", "_values"),
    torch.sparse_csr: ("crow_indices", "col_indices", "values"),
    torch.sparse_bsr: ("crow_indices", "col_indices", "values"),
    torch.sparse_csc: ("ccol_indices", "row_indices", "values"),
    torch.sparse_bsc: ("ccol_indices", "row_indices", "values"),
}

# `dir()` on every node is slow for big graphs; the `_saved_*` properties are defined on the
# node class, so their names are looked up once per class.
_SAVED_ATTRS: dict[type, tuple[str, ...]] = {}


@dataclass(frozen=True)
class SavedRecord:
    r"""One storage kept by one autograd node, as listed by :func:`saved_tensors`.

    Args:
        node (str): class name of the node, *e.g.* ``"AddmmBackward0"``.
        attr (str): where the node holds the tensor: ``"_saved_mat1"`` for built-in nodes,
            ``"saved_tensors[0]"`` or the ``ctx`` attribute path (``"packed.codes"``) for
            custom functions; a suffix names the part of a sparse or subclass tensor
            (``"_saved_mat1.crow_indices"``, ``"_saved_index._data"``).
        shape (tuple[int, ...]): shape of the tensor (or part) that holds the storage; may be
            a view smaller than the storage.
        dtype (torch.dtype): its dtype.
        nbytes (int): bytes of the whole storage (a view keeps all of it alive).
        storage (tuple): de-duplication key ``(device type, device index, data_ptr)``.
        first (bool): ``True`` for the first record of its storage; only those add to
            :func:`saved_bytes`.
        kind (str): ``"context"``, or ``"graph_cache"`` for the tensors of a gnnact
            :class:`~gnnact.ops.graph.Graph`. (default: :obj:`"context"`)

    Example:
        >>> x = torch.randn(100, 64, requires_grad=True)
        >>> record, = gnnact.memory.saved_tensors(x.exp().sum())  # exp keeps its result
        >>> record.node, record.attr, record.shape, record.nbytes, record.first
        ('ExpBackward0', '_saved_result', (100, 64), 25600, True)
    """

    node: str
    attr: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int
    storage: StorageKey
    first: bool
    kind: str = "context"


@dataclass(frozen=True)
class SavedBytes:
    """What an autograd graph keeps for backward, in bytes, by line (see :func:`breakdown`).

    Args:
        context (int): activations, masks and everything else the nodes keep.
        graph_cache (int): gnnact's graph structure (CSR, transposed CSR, degrees) held by
            its aggregation ops.

    Example:
        >>> from gnnact.memory import SavedBytes
        >>> line = SavedBytes(context=1000, graph_cache=240)
        >>> line.total
        1240
    """

    context: int
    graph_cache: int

    @property
    def total(self) -> int:
        """``context + graph_cache``: what :func:`saved_bytes` returns."""
        return self.context + self.graph_cache


def saved_bytes(
    output: Tensor | Sequence[Tensor],
    *,
    exclude: Iterable[Tensor | torch.nn.Module] = (),
    include_leaves: bool = False,
) -> int:
    r"""Bytes of the distinct storages that the autograd graph of ``output`` keeps for
    backward (see the module docstring for the exact definition).

    Call it after the forward pass and before ``backward()`` (or after a backward with
    ``retain_graph=True``). A tensor without ``grad_fn`` (no graph, or a leaf) keeps
    nothing: the result is 0.

    Args:
        output (torch.Tensor or Sequence[torch.Tensor]): the loss, or several outputs whose
            graphs are measured together (shared storages count once).
        exclude (Iterable[torch.Tensor or torch.nn.Module], optional): tensors whose storages
            are not counted, typically the input features ``data.x`` that live on anyway;
            a module stands for all its parameters and buffers, a
            :class:`~gnnact.quant.packed.PackedTensor` or
            :class:`~gnnact.quant.packed.PackedMask` for its tensors. (default: :obj:`()`)
        include_leaves (bool, optional): if :obj:`True`, storages of graph leaves
            (parameters and inputs that require grad) are counted when a node saves them;
            by default they are not, since they live independently of the graph. Storages
            in ``exclude`` stay excluded. (default: :obj:`False`)

    Returns:
        int: the number of bytes.

    Raises:
        TypeError: if ``output`` is not a tensor or a sequence of tensors, or ``exclude``
            holds something other than tensors, modules and packed objects.
        RuntimeError: if a backward pass already freed the saved tensors.

    Example:
        >>> from gnnact.memory import saved_bytes
        >>> lin, x = torch.nn.Linear(64, 64), torch.randn(100, 64)
        >>> loss = lin(x).relu().sum()
        >>> saved_bytes(loss, exclude=[x])  # the ReLU output: 100 x 64 float32
        25600
        >>> saved_bytes(loss)  # and the input the linear layer keeps for its weight gradient
        51200
    """
    return breakdown(output, exclude=exclude, include_leaves=include_leaves).total


def breakdown(
    output: Tensor | Sequence[Tensor],
    *,
    exclude: Iterable[Tensor | torch.nn.Module] = (),
    include_leaves: bool = False,
) -> SavedBytes:
    r""":func:`saved_bytes` by line: the context proper and gnnact's graph cache.

    Args:
        output (torch.Tensor or Sequence[torch.Tensor]): as in :func:`saved_bytes`.
        exclude (Iterable[torch.Tensor or torch.nn.Module], optional): as in
            :func:`saved_bytes`. (default: :obj:`()`)
        include_leaves (bool, optional): as in :func:`saved_bytes`. (default: :obj:`False`)

    Returns:
        SavedBytes: ``context`` and ``graph_cache`` in bytes (``total`` is their sum, the
        value of :func:`saved_bytes`).

    Example:
        >>> from gnnact.memory import breakdown
        >>> conv = gnnact.nn.GCNConv(16, 32, config=gnnact.Config(bits=2))
        >>> x, edge_index = torch.randn(100, 16), torch.randint(0, 100, (2, 400))
        >>> out = conv(x, edge_index)  # x needs no gradient: kept by reference, excluded
        >>> line = breakdown(out.sum(), exclude=[x, edge_index])
        >>> line.context, line.graph_cache > 0
        (0, True)
    """
    records = saved_tensors(output, exclude=exclude, include_leaves=include_leaves)
    context = sum(r.nbytes for r in records if r.first and r.kind == "context")
    graph = sum(r.nbytes for r in records if r.first and r.kind == "graph_cache")
    return SavedBytes(context, graph)


def saved_tensors(
    output: Tensor | Sequence[Tensor],
    *,
    exclude: Iterable[Tensor | torch.nn.Module] = (),
    include_leaves: bool = False,
) -> list[SavedRecord]:
    r"""List what the autograd graph of ``output`` keeps for backward, one
    :class:`SavedRecord` per (node, attribute, storage).

    A storage saved by several nodes appears once per node, with ``first=True`` only on its
    first record, so that ``saved_bytes(...) == sum(r.nbytes for r in records if r.first)``.
    Excluded storages (leaves, unless ``include_leaves=True``, and those of ``exclude``) do
    not appear at all. Records come in walk order: nodes near the output first.

    Args:
        output (torch.Tensor or Sequence[torch.Tensor]): as in :func:`saved_bytes`.
        exclude (Iterable[torch.Tensor or torch.nn.Module], optional): as in
            :func:`saved_bytes`. (default: :obj:`()`)
        include_leaves (bool, optional): as in :func:`saved_bytes`. (default: :obj:`False`)

    Returns:
        list[SavedRecord]: the records.

    Raises:
        TypeError: as :func:`saved_bytes`.
        RuntimeError: if a backward pass already freed the saved tensors.

    Example:
        >>> from gnnact.memory import saved_tensors
        >>> lin, x = torch.nn.Linear(64, 64), torch.randn(100, 64)
        >>> for r in saved_tensors(lin(x).relu().sum()):
        ...     print(r.node, r.attr, r.shape, r.nbytes, r.first)
        ReluBackward0 _saved_result (100, 64) 25600 True
        AddmmBackward0 _saved_mat1 (100, 64) 25600 True
    """
    outputs = _as_outputs(output)
    excluded = storage_keys(exclude)

    raw: list[tuple[str, str, Tensor, int, StorageKey, str]] = []
    leaf_keys: set[StorageKey] = set()

    # Iterative depth-first walk: deep GNNs (and long unrolled graphs) exceed Python's
    # recursion limit. The dict keeps every visited node alive, so ids are never reused.
    stack = [t.grad_fn for t in reversed(outputs) if t.grad_fn is not None]
    visited: dict[int, Any] = {}
    while stack:
        node = stack.pop()
        if id(node) in visited:
            continue
        visited[id(node)] = node
        name = type(node).__name__

        if isinstance(node, _AccumulateGrad):  # its variable is a graph leaf
            leaf_keys.update(key for _, _, _, key in tensor_storages(node.variable, ""))
        else:
            for attr, tensor in _node_tensors(node):
                kind = "graph_cache" if attr.startswith(_GRAPH_PREFIX) else "context"
                for suffix, part, nbytes, key in tensor_storages(tensor, attr):
                    raw.append((name, suffix, part, nbytes, key, kind))

        for next_node, _ in reversed(node.next_functions):
            if next_node is not None and id(next_node) not in visited:
                stack.append(next_node)

    if not include_leaves:
        excluded |= leaf_keys

    records: list[SavedRecord] = []
    seen: set[StorageKey] = set()
    for name, attr, part, nbytes, key, kind in raw:
        if key in excluded:
            continue
        records.append(SavedRecord(node=name, attr=attr, shape=tuple(part.shape),
                                   dtype=part.dtype, nbytes=nbytes, storage=key,
                                   first=key not in seen, kind=kind))
        seen.add(key)
    return records


def _as_outputs(output: Any) -> list[Tensor]:
    if isinstance(output, Tensor):
        return [output]
    if isinstance(output, Sequence) and not isinstance(output, (str, bytes)):
        for i, t in enumerate(output):
            if not isinstance(t, Tensor):
                raise TypeError(f"argument 'output' must be a Tensor or a sequence of Tensors, "
                                f"but element {i} is {type(t).__name__}")
        return list(output)
    raise TypeError(f"argument 'output' must be a Tensor or a sequence of Tensors, "
                    f"not {type(output).__name__}")


def argument_tensors(value: Any) -> list[Tensor]:
    """The tensors in a forward's arguments, also inside tuples, lists, dicts, PyG ``Data`` /
    ``HeteroData`` objects and ``torch_sparse.SparseTensor`` s: the caller's, resident
    whatever backward keeps.

    Args:
        value (Any): the arguments, *e.g.* ``(args, kwargs)`` of a forward call.

    Returns:
        list[torch.Tensor]: the tensors found, at most 5 containers deep.

    Example:
        >>> from gnnact.memory import argument_tensors
        >>> x, edge_index = torch.randn(4, 2), torch.tensor([[0, 1], [1, 2]])
        >>> len(argument_tensors(((x, {"edge_index": edge_index}), {"flag": True})))
        2
    """
    return _argument_tensors(value, [], 0)


def _argument_tensors(value: Any, out: list[Tensor], depth: int) -> list[Tensor]:
    if depth > 4:
        return out
    if isinstance(value, Tensor):
        out.append(value)
    elif isinstance(value, (tuple, list)):
        for v in value:
            _argument_tensors(v, out, depth + 1)
    elif isinstance(value, dict):
        for v in value.values():
            _argument_tensors(v, out, depth + 1)
    elif hasattr(value, "to_dict") and callable(value.to_dict):  # PyG Data / HeteroData
        _argument_tensors(value.to_dict(), out, depth + 1)
    elif hasattr(value, "storage") and hasattr(value, "csr"):  # torch_sparse.SparseTensor
        _argument_tensors([value.storage.row(), value.storage.col(), value.storage.value()],
                          out, depth + 1)
    return out


def storage_keys(exclude: Any) -> set[StorageKey]:
    """Storage keys of tensors, modules (their parameters and buffers) and packed objects: the
    identities :func:`saved_bytes` excludes for ``exclude=`` (and
    :class:`gnnact.compress_saved_tensors` for ``skip=``). A view has the key of its base, a
    sparse tensor the keys of its index and value tensors (see :func:`tensor_storages`).

    Args:
        exclude (torch.Tensor or torch.nn.Module or Iterable): a tensor, a module, a
            :class:`~gnnact.quant.PackedTensor` or :class:`~gnnact.quant.PackedMask`, or an
            iterable of them.

    Returns:
        set[tuple[str, int or None, int]]: the keys ``(device type, device index, data_ptr)``.

    Raises:
        TypeError: if ``exclude`` is not iterable or holds something else.

    Example:
        >>> from gnnact.memory import storage_keys
        >>> x = torch.randn(10, 4)
        >>> storage_keys([x, x[1:], x.t()]) == storage_keys(x)  # views share the storage
        True
        >>> len(storage_keys(torch.nn.Linear(4, 2)))  # its weight and bias
        2
    """
    # A single tensor or module is accepted as well; iterating a tensor would give its rows.
    if isinstance(exclude, (Tensor, torch.nn.Module, *_PACKED_TYPES)):
        exclude = [exclude]
    if not isinstance(exclude, Iterable):
        raise TypeError(f"argument 'exclude' must be an iterable of Tensors and Modules, "
                        f"not {type(exclude).__name__}")
    tensors: list[Tensor] = []
    for item in exclude:
        if isinstance(item, torch.nn.Module):
            tensors.extend(item.parameters())
            tensors.extend(item.buffers())
        elif isinstance(item, Tensor):
            tensors.append(item)
        elif isinstance(item, _PACKED_TYPES):
            tensors.extend(item.tensors())
        else:
            raise TypeError(f"argument 'exclude' must hold Tensors and Modules, "
                            f"got {type(item).__name__}")
    return {key for t in tensors for _, _, _, key in tensor_storages(t, "")}


def _node_tensors(node: Any) -> Iterator[tuple[str, Tensor]]:
    """The tensors ``node`` keeps for backward, each with the attribute path it sits at (a
    path starting with :data:`_GRAPH_PREFIX` for gnnact's graph cache)."""
    try:
        if isinstance(node, BackwardCFunction):  # custom autograd.Function: node is its ctx
            raw = getattr(node, "_raw_saved_tensors", None)
            if raw is None:
                saved = [("saved_tensors", node.saved_tensors)]
            else:
                saved = [(f"saved_tensors[{i}]", r) for i, r in enumerate(raw)]
            for path, value in saved:
                yield from _saved_value(node, "saved_tensors", path, value)
            for key, value in vars(node).items():
                yield from _ctx_tensors(value, key, set())
        else:
            for attr in _saved_attrs(type(node), node):
                raw = getattr(node, "_raw" + attr, None)
                value = getattr(node, attr) if raw is None else raw
                yield from _saved_value(node, attr, attr, value)
    except RuntimeError as e:
        # torch's own message speaks of a "second backward"; say what to do here instead.
        if "freed" in str(e) or "second time" in str(e):
            raise RuntimeError(_FREED_MESSAGE) from e
        raise


_SavedTensor = torch._C._autograd.SavedTensor


def _saved_value(node: Any, attr: str, path: str, value: Any) -> Iterator[tuple[str, Tensor]]:
    """The tensors of one saved value: a tensor, a raw saved tensor (read in its packed form,
    without the unpack hook), or a tuple/list of either."""
    if isinstance(value, _SavedTensor):
        # (No ``data`` on an older torch: the plain read then unpacks.)
        data = getattr(value, "data", None)
        if data is None:
            # Freed by a backward, or never defined: the plain read tells which (and raises
            # the "freed" error).
            plain = getattr(node, attr)
            if isinstance(plain, (tuple, list)):
                index = int(path[path.rindex("[") + 1:-1])
                plain = plain[index]
            if isinstance(plain, Tensor):
                yield path, plain
            return
        value = data
    if isinstance(value, Tensor):
        yield path, value
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from _saved_value(node, attr, f"{path}[{i}]", item)
    else:
        yield from _packed_parts(value, path)


def _packed_parts(value: Any, path: str) -> Iterator[tuple[str, Tensor]]:
    """The tensors that hold a packed object of gnnact's pipeline (anything with
    ``tensors()``; an offloaded item's host buffers; a shared one's item)."""
    tensors = getattr(value, "tensors", None)
    if callable(tensors):
        for i, t in enumerate(tensors()):
            yield f"{path}.tensors()[{i}]", t
        return
    host = getattr(value, "host", None)
    if isinstance(host, list):  # gnnact.swap.Swapped: pinned host copies
        for i, t in enumerate(host):
            yield f"{path}.host[{i}]", t
        return
    item = getattr(value, "item", None)
    if item is not None:  # a shared offloaded copy read in another shape
        yield from _packed_parts(item, f"{path}.item")


def _saved_attrs(cls: type, node: Any) -> tuple[str, ...]:
    attrs = _SAVED_ATTRS.get(cls)
    if attrs is None:
        attrs = tuple(a for a in dir(node) if a.startswith("_saved_"))
        _SAVED_ATTRS[cls] = attrs
    return attrs


#: Path prefix of the tensors of a gnnact Graph held on a ctx (the graph cache line).
_GRAPH_PREFIX = "graph:"


def _ctx_tensors(value: Any, path: str, seen: set[int]) -> Iterator[tuple[str, Tensor]]:
    """Tensors stored as a ``ctx`` attribute, also inside packed objects, gnnact graphs and
    containers."""
    from gnnact.ops.graph import Graph  # (gnnact.ops imports this module's users)

    if isinstance(value, Tensor):
        yield path, value
    elif isinstance(value, Graph):
        if id(value) in seen:
            return
        seen.add(id(value))
        for f in dataclasses.fields(value):
            for sub, t in _ctx_tensors(getattr(value, f.name), f"{path}.{f.name}", seen):
                yield (sub if sub.startswith(_GRAPH_PREFIX) else _GRAPH_PREFIX + sub), t
    elif isinstance(value, _PACKED_TYPES):
        # Name each tensor by its dataclass field (``codes``, ``scales``, ...).
        names = {id(getattr(value, f.name)): f.name for f in dataclasses.fields(value)}
        for i, t in enumerate(value.tensors()):
            yield f"{path}.{names.get(id(t), f'tensors()[{i}]')}", t
    elif isinstance(value, (tuple, list, dict)):
        if id(value) in seen:  # a container holding itself
            return
        seen.add(id(value))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, v in items:
            yield from _ctx_tensors(v, f"{path}[{k!r}]", seen)


# Tensor classes that are no wrapper subclass (checked by type first: the check costs more).
_PLAIN = (Tensor, torch.nn.Parameter)


def tensor_storages(t: Tensor, path: str) -> Iterator[tuple[str, Tensor, int, StorageKey]]:
    """Reduce ``t`` to the strided tensors that own its memory: ``(path, part, nbytes, key)``.

    A strided tensor yields itself with the bytes of its whole storage (a view keeps all of its
    base alive); a sparse tensor its index and value tensors; a traceable wrapper subclass
    (PyG's ``EdgeIndex``, nested tensors) its inner tensors and the tensors it caches as
    attributes. Storages of zero bytes (meta and empty tensors) are left out: they hold no
    memory, and their null data pointers would all share one key.

    Args:
        t (torch.Tensor): the tensor.
        path (str): the name of ``t``; the yielded paths add a suffix per part
            (``"adj._indices"``).

    Yields:
        tuple[str, torch.Tensor, int, tuple]: per storage, its path, the tensor (part) that
        holds it, its bytes and its key ``(device type, device index, data_ptr)``.

    Example:
        >>> from gnnact.memory import tensor_storages
        >>> x = torch.randn(10, 4)
        >>> [(p, n) for p, _, n, _ in tensor_storages(x[2:], "x")]  # the whole base
        [('x', 160)]
        >>> [(p, n) for p, _, n, _ in tensor_storages(x.to_sparse(), "adj")]
        [('adj._indices', 640), ('adj._values', 160)]
    """
    if type(t) not in _PLAIN and is_traceable_wrapper_subclass(t):
        # The wrapper itself has no valid storage; its memory is in the inner tensors. PyG's
        # EdgeIndex also caches tensors (its transposed index ``_T_index``, ``_value``) that
        # ``__tensor_flatten__`` leaves out, so the instance attributes are read as well.
        names, _ = t.__tensor_flatten__()
        inner: dict[str, Any] = {name: getattr(t, name) for name in names}
        for name, value in getattr(t, "__dict__", {}).items():
            inner.setdefault(name, value)
        for name, value in inner.items():
            if isinstance(value, Tensor):
                yield from tensor_storages(value, f"{path}.{name}")
            elif isinstance(value, (tuple, list)):
                for i, v in enumerate(value):
                    if isinstance(v, Tensor):
                        yield from tensor_storages(v, f"{path}.{name}[{i}]")
        return

    parts = _SPARSE_PARTS.get(t.layout)
    if parts is not None:
        for name in parts:
            yield from tensor_storages(getattr(t, name)(), f"{path}.{name}")
        return

    if t.is_meta:
        return
    try:
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        if nbytes == 0:
            return
        key = storage_key(storage)
    except (RuntimeError, NotImplementedError) as e:
        warnings.warn(f"saved_bytes: cannot read the storage of a {type(t).__name__} "
                      f"(layout {t.layout}) at '{path}', not counted: {e}", stacklevel=2)
        return
    yield path, t, nbytes, key
