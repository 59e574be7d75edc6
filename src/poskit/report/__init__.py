"""Turning run directories into numbers, markdown tables and PNG plots."""
from .aggregate import aggregate_compare, learning_curves, mean_std
from .plots import plot_compare, plot_extrapolation, plot_runs
from .tables import compare_table, extrapolation_table, markdown_table, variants_table

__all__ = ["aggregate_compare", "compare_table", "extrapolation_table", "learning_curves", "markdown_table",
           "mean_std", "plot_compare", "plot_extrapolation", "plot_runs", "variants_table"]
