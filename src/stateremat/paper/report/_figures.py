"""Shared matplotlib helpers (Agg backend): save as PNG + SVG, method colours."""
from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: figures are files, never windows
import matplotlib.pyplot as plt  # noqa: E402

from ..._shared.io import atomic_write_bytes  # noqa: E402

#: Joint planning in orange, the correctly costed eager/whole control in blue (paper Fig. 3).
METHOD_COLORS = {"joint": "#e66101", "eager_whole": "#2c7bb6"}
OTHER_COLOR = "#9e9e9e"


def method_color(method: str) -> str:
    """Colour of ``method`` in every figure."""
    return METHOD_COLORS.get(method, OTHER_COLOR)


def new_figure(n_panels: int, *, width_in: float = 7.5, panel_height_in: float = 3.2):
    """A figure with ``n_panels`` stacked axes; returns ``(fig, [ax, ...])``."""
    fig, axes = plt.subplots(n_panels, 1, figsize=(width_in, panel_height_in * n_panels),
                             squeeze=False)
    return fig, [a for a in axes[:, 0]]


def save_figure(fig, stem: str | Path) -> list[Path]:
    """Write ``stem.png`` (150 dpi) and ``stem.svg``, close the figure, return both paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    fig.tight_layout()
    # SVG: fixed hash salt + no date, so equal inputs give equal files.
    plt.rcParams["svg.hashsalt"] = "stateremat"
    for path, kw in ((paths[0], {"dpi": 150}), (paths[1], {"metadata": {"Date": None}})):
        buf = io.BytesIO()
        fig.savefig(buf, format=path.suffix[1:], **kw)
        atomic_write_bytes(path, buf.getvalue())  # a reader never sees half a figure
    plt.close(fig)
    return paths
