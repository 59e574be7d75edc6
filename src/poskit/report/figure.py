"""Saving a finished matplotlib figure: the one tail every plot function shares."""
from __future__ import annotations

from pathlib import Path


def save_figure(fig, path, dpi: int) -> Path:
    """Lay out `fig`, write it to `path` at `dpi` and close it; returns `path` as a Path. The figure is closed
    even when saving fails (a long report loop must not pile up open figures), and the failure names the
    file. The parent directory is not created: callers write into directories they made."""
    import matplotlib.pyplot as plt

    path = Path(path)
    try:
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
    except OSError as e:
        raise OSError(e.errno, f"cannot save the figure ({e.strerror or e})", str(path)) from e
    except ValueError as e:  # e.g. a file extension matplotlib has no writer for
        raise ValueError(f"{path}: cannot save the figure ({e})") from e
    finally:
        plt.close(fig)
    return path
