"""Datasets: real graphs by name (:func:`load_dataset`) and synthetic graphs with the shapes
of the big benchmarks (:func:`synthetic_graph`)."""

from gnnact.data import datasets
from gnnact.data.datasets import (
           DATASETS,
           DatasetCorruptError,
           DatasetNotFoundError,
           canonical_name,
           data_root,
           load_dataset,
           random_split,
)
from gnnact.data.synthetic import SHAPES, synthetic_graph, synthetic_like

__all__ = ["DATASETS", "SHAPES", "DatasetCorruptError", "DatasetNotFoundError", "canonical_name",
           "data_root", "datasets", "load_dataset", "random_split", "synthetic_graph",
           "synthetic_like"]
