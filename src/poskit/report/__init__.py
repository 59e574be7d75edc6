"""Turning run directories into numbers, markdown tables and PNG plots, and the evidence behind the documented
tables: the results record every experiment writes (record.py), the tables made from records (results_tables.py),
staleness (staleness.py), the markers `poskit report` regenerates (markers.py), the coverage of the papers
(coverage.py) and `poskit report collect` (collect.py).

The names below are imported on first use, so that importing one light module of the package (record.py, which
every command uses to record its command line) does not load matplotlib."""
import importlib

_EXPORTS = {"aggregate_compare": "aggregate", "learning_curves": "aggregate", "mean_std": "aggregate",
            "split_learning_curves": "aggregate",
            "plot_compare": "plots", "plot_extrapolation": "plots", "plot_runs": "plots", "plot_split_curves": "plots",
            "compare_table": "tables", "extrapolation_table": "tables", "markdown_table": "tables",
            "variants_table": "tables"}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
