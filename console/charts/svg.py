"""Server-rendered SVG charts: lines and steps over time, horizontal bars by category.

Plain Python with no Django, no JavaScript and nothing fetched: a chart is a string of SVG
markup that a page embeds as it is. Every piece of text is escaped here, and the result is a
``SvgMarkup`` whose ``__html__`` lets Django templates insert it without escaping it again.
Sizes suit an admin page at 1280 px: 13 px text, a 960 px wide drawing that shrinks with its box.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

__all__ = [
    "PALETTE",
    "Bar",
    "Reference",
    "Series",
    "SvgMarkup",
    "bar_chart",
    "line_chart",
    "nice_ticks",
]

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
WIDTH = 960
FONT = 13
_TITLE_Y = 20
_INK = "#333333"
_GRID = "#e3e3e3"
_REFERENCE = "#7a1f1f"


class SvgMarkup(str):
    """SVG text whose every label is escaped already; safe to embed in HTML as it is."""

    __slots__ = ()

    def __html__(self) -> str:
        return str(self)


@dataclass(frozen=True, slots=True)
class Series:
    """One line: ``(x, y)`` points in x order; a ``None`` y leaves a gap. ``step`` holds each
    value until the next point, as a count that changes at instants does."""

    label: str
    points: Sequence[tuple[float, float | None]]
    step: bool = False


@dataclass(frozen=True, slots=True)
class Reference:
    """A horizontal line across a line chart, such as a bound, with its label."""

    label: str
    value: float


@dataclass(frozen=True, slots=True)
class Bar:
    """One category's value; ``marker`` draws a tick across the bar (its bound), ``note`` is
    written after the value (say, what the bound is)."""

    label: str
    value: float | None
    marker: float | None = None
    note: str = ""


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values (steps of 1, 2 or 5 times a power of ten) that cover
    ``low`` to ``high``."""
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError("tick range must be finite")
    if high < low:
        low, high = high, low
    if high == low:
        high = low + 1.0
    raw = (high - low) / max(count, 1)
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step) * step
    ticks = []
    value = first
    while value < high + step * 0.5:
        ticks.append(round(value, 12))
        if value >= high:
            break
        value += step
    return ticks


def _number(value: float) -> str:
    """A tick or value label: thousands grouped, no trailing zeros."""
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    text = f"{value:,.3f}".rstrip("0").rstrip(".")
    return text


def _text(x: float, y: float, content: str, *, anchor: str = "start", **attrs: str) -> str:
    extra = "".join(f' {name.replace("_", "-")}="{escape(v)}"' for name, v in attrs.items())
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{extra}>{escape(content)}</text>'


def _frame(width: int, height: int, title: str, body: list[str]) -> SvgMarkup:
    label = escape(title)
    return SvgMarkup(
        f'<svg xmlns="http://www.w3.org/2000/svg" class="sluice-chart" role="img" '
        f'aria-label="{label}" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" style="max-width: 100%; height: auto" '
        f'font-family="system-ui, sans-serif" font-size="{FONT}" fill="{_INK}">'
        f"<title>{label}</title>"
        + _text(0, _TITLE_Y - 4, title, font_weight="bold", font_size=str(FONT + 2))
        + "".join(body)
        + "</svg>"
    )


def _empty(width: int, height: int, title: str, message: str) -> SvgMarkup:
    return _frame(width, height, title, [_text(width / 2, height / 2, message, anchor="middle")])


def _legend(items: Sequence[tuple[str, str, bool]], width: int, y: float) -> list[str]:
    """Legend entries right-aligned on one row: (label, colour, dashed)."""
    parts = []
    x = float(width)
    for label, colour, dashed in reversed(items):
        x -= len(label) * FONT * 0.6 + 34
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        parts.append(
            f'<line x1="{x:.1f}" y1="{y - 4:.1f}" x2="{x + 22:.1f}" y2="{y - 4:.1f}" '
            f'stroke="{colour}" stroke-width="3"{dash}/>' + _text(x + 28, y, label)
        )
    return parts


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_label: str,
    y_label: str,
    references: Sequence[Reference] = (),
    y_max: float | None = None,
    width: int = WIDTH,
    height: int = 300,
) -> SvgMarkup:
    """Lines (or steps) of ``series`` against a shared x axis starting at the data's first x,
    and a y axis from 0 to the largest value, reference or ``y_max``.

    Its parameters past ``series`` are keyword-only and describe the drawing (titles, reference
    lines, scale, size); drawing the axes, grid, lines and legend together keeps one chart's
    coordinates in one place, which is why it runs long."""
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points if y is not None]
    if not xs or not ys:
        return _empty(width, 120, title, "no data recorded")
    left, right, top, bottom = 68.0, 28.0, 46.0, 46.0
    plot_w, plot_h = width - left - right, height - top - bottom
    x_ticks = nice_ticks(min(xs), max(xs), 8)
    x_lo, x_hi = x_ticks[0], x_ticks[-1]
    top_value = max([*ys, *(r.value for r in references), y_max or 0.0, 1e-9])
    y_ticks = nice_ticks(0.0, top_value, 5)
    y_hi = y_ticks[-1]

    def px(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * plot_w

    def py(y: float) -> float:
        return top + plot_h - y / y_hi * plot_h

    body: list[str] = []
    for tick in y_ticks:
        body.append(
            f'<line x1="{left:.1f}" y1="{py(tick):.1f}" x2="{left + plot_w:.1f}" '
            f'y2="{py(tick):.1f}" stroke="{_GRID}"/>'
        )
        body.append(_text(left - 8, py(tick) + 4, _number(tick), anchor="end"))
    for tick in x_ticks:
        body.append(_text(px(tick), top + plot_h + 18, _number(tick), anchor="middle"))
    body.append(
        f'<line x1="{left:.1f}" y1="{top + plot_h:.1f}" x2="{left + plot_w:.1f}" '
        f'y2="{top + plot_h:.1f}" stroke="{_INK}"/>'
    )
    body.append(_text(left + plot_w / 2, height - 6, x_label, anchor="middle"))
    body.append(
        _text(
            14,
            top + plot_h / 2,
            y_label,
            anchor="middle",
            transform=f"rotate(-90 14 {top + plot_h / 2:.1f})",
        )
    )
    legend: list[tuple[str, str, bool]] = []
    for index, line in enumerate(series):
        colour = PALETTE[index % len(PALETTE)]
        legend.append((line.label, colour, False))
        path = _path(line, px, py)
        if path:
            body.append(
                f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="2" '
                f'stroke-linejoin="round"><title>{escape(line.label)}</title></path>'
            )
    for reference in references:
        y = py(reference.value)
        body.append(
            f'<line x1="{left:.1f}" y1="{y:.1f}" x2="{left + plot_w:.1f}" y2="{y:.1f}" '
            f'stroke="{_REFERENCE}" stroke-width="1.5" stroke-dasharray="6 4"/>'
        )
        # Above the line in the lower half, below it in the upper half, where lines crowd less.
        label_y = y - 5 if reference.value < y_hi / 2 else y + 15
        body.append(
            _text(left + plot_w - 4, label_y, reference.label, anchor="end", fill=_REFERENCE)
        )
    body += _legend(legend, width, _TITLE_Y + 14)
    return _frame(width, height, title, body)


def _path(line: Series, to_x: Callable[[float], float], to_y: Callable[[float], float]) -> str:
    """The SVG path data of one series; a ``None`` value ends a segment."""
    commands: list[str] = []
    drawing = False
    for x, y in line.points:
        if y is None:
            drawing = False
            continue
        sx, sy = to_x(x), to_y(y)
        if not drawing:
            commands.append(f"M{sx:.1f},{sy:.1f}")
            drawing = True
        elif line.step:
            commands.append(f"H{sx:.1f}V{sy:.1f}")
        else:
            commands.append(f"L{sx:.1f},{sy:.1f}")
    return "".join(commands)


def bar_chart(
    bars: Sequence[Bar],
    *,
    title: str,
    value_label: str,
    x_max: float | None = None,
    width: int = WIDTH,
) -> SvgMarkup:
    """One horizontal bar per category, its value at the end and its marker (a bound) across."""
    if not bars:
        return _empty(width, 100, title, "nothing to show")
    row, top, bottom = 30.0, 40.0, 46.0
    label_w = min(260.0, max(len(bar.label) for bar in bars) * FONT * 0.62 + 16)
    left, right = label_w, 200.0
    plot_w = width - left - right
    height = int(top + row * len(bars) + bottom)
    values = [b.value for b in bars if b.value is not None]
    markers = [b.marker for b in bars if b.marker is not None]
    x_ticks = nice_ticks(0.0, max([*values, *markers, x_max or 0.0, 1e-9]), 5)
    x_hi = x_ticks[-1]

    def px(x: float) -> float:
        return left + x / x_hi * plot_w

    body: list[str] = []
    plot_bottom = top + row * len(bars)
    for tick in x_ticks:
        body.append(
            f'<line x1="{px(tick):.1f}" y1="{top:.1f}" x2="{px(tick):.1f}" '
            f'y2="{plot_bottom:.1f}" stroke="{_GRID}"/>'
        )
        body.append(_text(px(tick), plot_bottom + 18, _number(tick), anchor="middle"))
    body.append(_text(left + plot_w / 2, height - 6, value_label, anchor="middle"))
    for index, bar in enumerate(bars):
        y = top + index * row
        body.append(_text(left - 8, y + row / 2 + 4, bar.label, anchor="end"))
        if bar.value is None:
            body.append(_text(left + 4, y + row / 2 + 4, "—"))
            continue
        colour = PALETTE[index % len(PALETTE)]
        end = px(bar.value)
        body.append(
            f'<rect x="{left:.1f}" y="{y + 5:.1f}" width="{max(end - left, 1.0):.1f}" '
            f'height="{row - 10:.1f}" fill="{colour}"><title>{escape(bar.label)}: '
            f"{escape(_number(bar.value))}</title></rect>"
        )
        shown = _number(bar.value) + (f" {bar.note}" if bar.note else "")
        body.append(_text(end + 6, y + row / 2 + 4, shown))
        if bar.marker is not None:
            mx = px(bar.marker)
            body.append(
                f'<line x1="{mx:.1f}" y1="{y + 1:.1f}" x2="{mx:.1f}" y2="{y + row - 1:.1f}" '
                f'stroke="{_REFERENCE}" stroke-width="3"/>'
            )
    return _frame(width, height, title, body)
