"""report.figure.save_figure: the file at the asked dpi, the figure closed whether or not saving worked, and a
failure that names the file."""
from __future__ import annotations

from pathlib import Path

import pytest
from extras import need

plt = need("matplotlib.pyplot", "experiments", "matplotlib (plots)")

from poskit.report.figure import save_figure  # noqa: E402


def _figure(width=2.0, height=1.5):
    fig, ax = plt.subplots(figsize=(width, height))
    ax.plot([0, 1, 2], [1, 0, 1])
    return fig


@pytest.mark.parametrize("dpi", [50, 110, 120])
def test_the_png_has_the_pixels_of_its_size_and_dpi_and_the_figure_is_closed(tmp_path, dpi):
    from matplotlib.image import imread

    fig = _figure()
    path = save_figure(fig, str(tmp_path / "f.png"), dpi=dpi)
    assert isinstance(path, Path) and path == tmp_path / "f.png"
    # the size matplotlib itself writes for this figure and dpi, computed independently
    height, width = imread(path).shape[:2]
    assert (width, height) == (round(2.0 * dpi), round(1.5 * dpi))
    assert not plt.fignum_exists(fig.number)


def test_a_directory_that_does_not_exist_is_an_error_naming_the_file_and_the_figure_is_closed(tmp_path):
    fig = _figure()
    target = tmp_path / "missing" / "plot.png"
    with pytest.raises(OSError) as e:
        save_figure(fig, target, dpi=100)
    assert str(target) in str(e.value) and e.value.filename == str(target)
    assert not plt.fignum_exists(fig.number)
    assert not target.parent.exists()  # nothing is created behind the caller's back


def test_a_format_matplotlib_cannot_write_is_an_error_naming_the_file_and_the_figure_is_closed(tmp_path):
    fig = _figure()
    target = tmp_path / "plot.notaformat"
    with pytest.raises(ValueError, match=str(target).replace(".", r"\.")):
        save_figure(fig, target, dpi=100)
    assert not plt.fignum_exists(fig.number) and not target.exists()


def test_every_plot_in_the_package_saves_through_the_helper():
    src = Path(__file__).resolve().parents[1] / "src" / "poskit"
    callers = [p.relative_to(src).as_posix() for p in src.rglob("*.py") if ".savefig(" in p.read_text()]
    assert callers == ["report/figure.py"]


@pytest.mark.parametrize("n_lines", [3, 14])
def test_an_extrapolation_plot_with_many_lines_keeps_its_legend_off_the_curves(tmp_path, monkeypatch, n_lines):
    # with seeds x test-time scalings the legend listed 15 lines over the panels' curves; beyond
    # LEGEND_INSIDE_MAX lines it goes to a panel of its own
    from poskit.report import plots

    sweeps = {f"model {i}": [{"length": n, "perplexity": 8.0 + i + n / 128, "last_perplexity": 9.0 + i}
                             for n in (128, 256, 512)] for i in range(n_lines)}
    seen = {}

    def keep(fig, path, dpi):
        seen["legends"] = [(ax.get_legend() is not None, ax.has_data()) for ax in fig.axes]
        return save_figure(fig, path, dpi)

    monkeypatch.setattr(plots, "save_figure", keep)
    plots.plot_extrapolation(sweeps, tmp_path / "x.png", context=128)
    beside = n_lines > plots.LEGEND_INSIDE_MAX
    # (legend, data) per panel: inside each data panel, or only on an empty panel beside them
    assert seen["legends"] == ([(False, True), (False, True), (True, False)] if beside else [(True, True)] * 2)
