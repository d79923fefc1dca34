"""The SVG of bench/generate/run (issue 35), written by hand (no matplotlib in the venv):
per model, output tokens/s by closed-loop concurrency, and goodput by Poisson load, one line
of markers per engine.

    svg(panels, title) -> str
    panel: {"title": str, "x_label": str, "y_label": str, "x": [labels],
            "series": {engine: [value or None per x]}}
"""
import html

COLORS = {"caf-serving": "#d62728", "caf-targets": "#ff7f0e", "llama.cpp": "#1f77b4",
          "ort-genai": "#2ca02c", "transformers": "#7f7f7f"}
OTHER = ["#9467bd", "#8c564b", "#e377c2", "#17becf"]

W, H = 420, 300            # one panel
LEFT, RIGHT, TOP, BOTTOM = 62, 14, 30, 46


def nice_ceiling(v):
    """The smallest 1, 2 or 5 x 10^k at or above v (the y axis' top)."""
    if v <= 0:
        return 1.0
    k = 1.0
    while k * 10 < v:
        k *= 10
    while k > v * 10:
        k /= 10
    for m in (1, 2, 5, 10):
        if m * k >= v:
            return m * k
    return 10 * k


def fmt(v):
    return f"{v:,.0f}" if v >= 10 else f"{v:g}"


def panel_svg(p, x0, y0, colors):
    out = []
    e = html.escape
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    vals = [v for s in p["series"].values() for v in s if v is not None]
    top = nice_ceiling(max(vals, default=1.0) * 1.05)
    n = len(p["x"])
    xs = [x0 + LEFT + (pw * (i + 0.5) / n) for i in range(n)]
    y = lambda v: y0 + TOP + ph * (1 - v / top)
    out.append(f'<text x="{x0 + W / 2}" y="{y0 + 18}" text-anchor="middle" '
               f'font-weight="bold">{e(p["title"])}</text>')
    for i in range(6):
        v = top * i / 5
        out.append(f'<line x1="{x0 + LEFT}" x2="{x0 + LEFT + pw}" y1="{y(v):.1f}" '
                   f'y2="{y(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{x0 + LEFT - 5}" y="{y(v) + 4:.1f}" text-anchor="end" '
                   f'font-size="11">{fmt(v)}</text>')
    out.append(f'<rect x="{x0 + LEFT}" y="{y0 + TOP}" width="{pw}" height="{ph}" '
               'fill="none" stroke="#444"/>')
    for xi, label in zip(xs, p["x"]):
        out.append(f'<text x="{xi:.1f}" y="{y0 + TOP + ph + 16}" text-anchor="middle" '
                   f'font-size="11">{e(str(label))}</text>')
    out.append(f'<text x="{x0 + LEFT + pw / 2}" y="{y0 + H - 8}" text-anchor="middle" '
               f'font-size="12">{e(p["x_label"])}</text>')
    out.append(f'<text transform="translate({x0 + 14},{y0 + TOP + ph / 2}) rotate(-90)" '
               f'text-anchor="middle" font-size="12">{e(p["y_label"])}</text>')
    for name, series in p["series"].items():
        c = colors[name]
        pts = [(xi, y(v)) for xi, v in zip(xs, series) if v is not None]
        if len(pts) > 1:
            out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="'
                       + " ".join(f"{a:.1f},{b:.1f}" for a, b in pts) + '"/>')
        for a, b in pts:
            out.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3.5" fill="{c}"/>')
    return out


def svg(panels, title, columns=2):
    """panels laid out `columns` to a row, a legend of every engine above them."""
    names = []
    for p in panels:
        for name in p["series"]:
            if name not in names:
                names.append(name)
    spare = iter(OTHER * 4)
    colors = {n: COLORS.get(n) or next(spare) for n in names}
    rows = (len(panels) + columns - 1) // columns
    width, legend_h = W * columns, 44
    height = legend_h + H * rows
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13">'
           f'{html.escape(title)}</text>']
    x = 20
    for n in names:
        out.append(f'<circle cx="{x}" cy="32" r="4" fill="{colors[n]}"/>')
        out.append(f'<text x="{x + 8}" y="36">{html.escape(n)}</text>')
        x += 20 + 7.5 * len(n)
    for i, p in enumerate(panels):
        out += panel_svg(p, W * (i % columns), legend_h + H * (i // columns), colors)
    out.append("</svg>")
    return "\n".join(out) + "\n"
