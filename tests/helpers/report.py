"""Pixels of the report pages: decoded PNGs, headless Chromium screenshots, and the attempt marks of a job's loss
plot found in either (tests/unit/report/test_report.py; a cluster test checks a real preempted run's report with
``page_marks``)."""

from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from hpctrain.report.plots import MARK_COLOUR

CHROMIUM = shutil.which("chromium")
MARK_RGB = tuple(int(MARK_COLOUR[i:i + 2], 16) for i in (1, 3, 5))
MARK_PIXELS = 100  # of a column crossed by a mark (dashed, across axes ~260 pixels high: ~160)
MARGIN = 0.05  # of the data's x range, that matplotlib leaves on either side of it (rcParams["axes.xmargin"])
IMG = re.compile(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)">')


def chromium(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Headless Chromium with ``args``."""
    assert CHROMIUM, "chromium not installed (scripts/install installs it)"
    return subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
                          capture_output=True, text=True, timeout=timeout)


def screenshot(page: Path, out: Path) -> np.ndarray:
    """The page's pixels as Chromium shows it in a 1200 x 2400 window (its first plots), written to ``out``."""
    done = chromium(f"--screenshot={out}", "--window-size=1200,2400", page.resolve().as_uri())
    assert out.exists(), done.stderr
    return pixels(out.read_bytes())


def plot_images(html: str) -> dict[str, bytes]:
    """A report page's embedded PNGs by their alt text (the plot's title)."""
    return {alt: base64.b64decode(data) for alt, data in IMG.findall(html)}


def pixels(png: bytes) -> np.ndarray:
    """A PNG's (rows, columns, RGB) values, 0 to 255."""
    import matplotlib.image

    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    return (matplotlib.image.imread(io.BytesIO(png), format="png")[..., :3] * 255).round()


def colour_mask(image: np.ndarray, colour: tuple[int, ...], tolerance: int = 12) -> np.ndarray:
    """Where the image is ``colour``, each channel within ``tolerance``."""
    return np.abs(image - np.array(colour)).max(axis=-1) <= tolerance


def mark_columns(image: np.ndarray, min_pixels: int = MARK_PIXELS) -> list[float]:
    """The x positions (the mean column of each run of adjacent columns) of the vertical lines in MARK_COLOUR:
    columns with at least ``min_pixels`` pixels of it (a mark's label or legend entry has far fewer)."""
    return _runs(np.flatnonzero(colour_mask(image, MARK_RGB).sum(axis=0) >= min_pixels))


def _runs(columns: np.ndarray) -> list[float]:
    """The mean of each run of adjacent columns."""
    runs = np.split(columns, np.flatnonzero(np.diff(columns) > 1) + 1) if columns.size else []
    return [float(run.mean()) for run in runs]


def mark_steps(image: np.ndarray, first_step: int, last_step: int) -> list[float]:
    """The marks' x positions as steps of a plot whose curves go from ``first_step`` to ``last_step``: mapped
    through its frame (the columns of its left and right spines, found in the rows the marks cross), which
    matplotlib puts MARGIN of that range beyond them."""
    xs = mark_columns(image)
    assert xs, "no marks"
    rows = np.flatnonzero(colour_mask(image, MARK_RGB)[:, [round(x) for x in xs]].any(axis=1))
    band = colour_mask(image[rows.min():rows.max() + 1], (0, 0, 0))
    spines = _runs(np.flatnonzero(band.mean(axis=0) > 0.9))
    left, right = spines[0], spines[-1]
    low, high = first_step - MARGIN * (last_step - first_step), last_step + MARGIN * (last_step - first_step)
    return [low + (x - left) / (right - left) * (high - low) for x in xs]


def page_marks(page: Path) -> list[float]:
    """The x positions of the attempt marks in a Chromium screenshot of a job report (the marks' colour is on
    its loss plot only)."""
    with tempfile.TemporaryDirectory() as tmp:
        return mark_columns(screenshot(page, Path(tmp) / "shot.png"))


def assert_marks_at(xs: list[float], steps: list[int], tolerance: float = 1.5) -> None:
    """The marks are one per step (``steps`` ascending, distinct), placed as the steps are: each where the first
    and last marks' scale puts its step, within ``tolerance`` pixels (with 2 marks, only their order is checked)."""
    assert len(xs) == len(steps), f"{len(xs)} marks at x = {xs}, expected {len(steps)} (steps {steps})"
    if len(xs) < 2:
        return
    scale = (xs[-1] - xs[0]) / (steps[-1] - steps[0])
    assert scale > 0, f"marks at x = {xs} not in the order of steps {steps}"
    expected = [xs[0] + scale * (step - steps[0]) for step in steps]
    assert np.allclose(xs, expected, atol=tolerance), f"marks at x = {xs}, steps {steps} would put them at {expected}"
