"""Datasets: synthetic graphs with the shapes of the big benchmarks (loaders come later)."""

from gnnact.data.synthetic import synthetic_graph

__all__ = ["synthetic_graph"]
