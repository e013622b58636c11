// Hand-written SVG charts (no library, nothing to download): a line chart with
// ±std bands, horizontal bars and a histogram. Every series differs by dash
// pattern and marker shape as well as colour, and carries its numbers in
// data-* attributes and <title>s, so the chart reads without colour and can be
// checked against the JSON it was drawn from.
const NS = "http://www.w3.org/2000/svg";
export const COLORS = ["#1d4e89", "#c0392b", "#1e8449", "#7d3c98", "#b9770e", "#117a8b", "#555"];
export const DASHES = ["", "7 4", "2 3", "10 3 2 3", "4 4", "1 5", "12 6"];
export const MARKERS = ["circle", "square", "triangle", "diamond", "circle", "square", "triangle"];

function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) el.setAttribute(k, String(v));
  for (const c of children) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

function marker(shape, x, y, r, color, attrs) {
  const common = { fill: color, stroke: "#fff", "stroke-width": 1, ...attrs };
  if (shape === "square") return s("rect", { x: x - r, y: y - r, width: 2 * r, height: 2 * r, ...common });
  if (shape === "triangle") return s("polygon", { points: `${x},${y - r * 1.2} ${x - r * 1.1},${y + r * 0.8} ${x + r * 1.1},${y + r * 0.8}`, ...common });
  if (shape === "diamond") return s("polygon", { points: `${x},${y - r * 1.3} ${x + r * 1.1},${y} ${x},${y + r * 1.3} ${x - r * 1.1},${y}`, ...common });
  return s("circle", { cx: x, cy: y, r, ...common });
}

function niceTicks(lo, hi, n = 5) {
  const step0 = (hi - lo) / n;
  const mag = 10 ** Math.floor(Math.log10(step0 || 1));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((st) => st >= step0) || step0;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9; v += step) out.push(Number(v.toFixed(10)));
  return out;
}

// opts: {title, xLabel, yLabel, series:[{id, label, points:[{x, y, std}], connect}],
//        xTicks:[{x, label}], hlines:[{y, label}], mark:{series, x, label}, yFormat}
export function lineChart(opts) {
  const W = 760, H = 400, m = { l: 58, r: 150, t: 16, b: 52 };
  const pts = opts.series.flatMap((sr) => sr.points);
  const ys = pts.flatMap((p) => [p.y - (p.std || 0), p.y + (p.std || 0)]).concat((opts.hlines || []).map((l) => l.y));
  let ylo = Math.min(...ys), yhi = Math.max(...ys);
  const pad = (yhi - ylo) * 0.08 || 0.05;
  ylo -= pad; yhi += pad;
  const xs = pts.map((p) => p.x).concat((opts.xTicks || []).map((t) => t.x));
  let xlo = Math.min(...xs), xhi = Math.max(...xs);
  if (xlo === xhi) { xlo -= 1; xhi += 1; }
  const xpad = (xhi - xlo) * 0.04;
  xlo -= xpad; xhi += xpad;
  const X = (x) => m.l + ((x - xlo) / (xhi - xlo)) * (W - m.l - m.r);
  const Y = (y) => H - m.b - ((y - ylo) / (yhi - ylo)) * (H - m.t - m.b);
  const yf = opts.yFormat || ((v) => v.toFixed(2));
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-labelledby": "" });
  const tid = `t${Math.random().toString(36).slice(2, 8)}`;
  svg.setAttribute("aria-labelledby", tid);
  svg.append(s("title", { id: tid }, opts.title || "chart"));
  const axes = s("g", { class: "axes" });
  for (const v of niceTicks(ylo, yhi)) {
    axes.append(s("line", { x1: m.l, x2: W - m.r, y1: Y(v), y2: Y(v), stroke: "#ddd" }),
      s("text", { x: m.l - 6, y: Y(v) + 4, "text-anchor": "end", class: "tick" }, yf(v)));
  }
  const xticks = opts.xTicks || niceTicks(xlo, xhi).map((x) => ({ x, label: String(x) }));
  for (const t of xticks) {
    axes.append(s("line", { x1: X(t.x), x2: X(t.x), y1: H - m.b, y2: H - m.b + 5, stroke: "#333" }),
      s("text", { x: X(t.x), y: H - m.b + 19, "text-anchor": "middle", class: "tick" }, t.label));
  }
  axes.append(s("line", { x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b, stroke: "#333" }),
    s("line", { x1: m.l, x2: m.l, y1: m.t, y2: H - m.b, stroke: "#333" }),
    s("text", { x: (m.l + W - m.r) / 2, y: H - 10, "text-anchor": "middle", class: "axis-label" }, opts.xLabel || ""),
    s("text", { x: 14, y: (m.t + H - m.b) / 2, "text-anchor": "middle", class: "axis-label",
      transform: `rotate(-90 14 ${(m.t + H - m.b) / 2})` }, opts.yLabel || ""));
  svg.append(axes);
  const ends = [];  // labels at the right end of lines, spread apart below so none overlaps another
  for (const l of opts.hlines || []) {
    const label = s("text", { x: W - m.r + 4, y: Y(l.y) + 4, class: "tick" }, `${l.label} ${yf(l.y)}`);
    ends.push(label);
    svg.append(s("g", { class: "hline", "data-label": l.label, "data-value": l.y },
      s("line", { x1: m.l, x2: W - m.r, y1: Y(l.y), y2: Y(l.y), stroke: "#777", "stroke-dasharray": "3 3" }), label));
  }
  opts.series.forEach((sr, i) => {
    const color = sr.color || COLORS[i % COLORS.length], dash = sr.dash ?? DASHES[i % DASHES.length];
    const shape = sr.marker || MARKERS[i % MARKERS.length];
    const g = s("g", { class: "series", "data-series": sr.id, "data-label": sr.label });
    const line = sr.points.filter((p) => p.connect !== false);
    if (sr.connect !== false && line.length > 1) {
      if (line.some((p) => p.std)) {
        const up = line.map((p) => `${X(p.x)},${Y(p.y + (p.std || 0))}`);
        const down = line.slice().reverse().map((p) => `${X(p.x)},${Y(p.y - (p.std || 0))}`);
        g.append(s("polygon", { class: "band", points: up.concat(down).join(" "), fill: color, "fill-opacity": 0.13 }));
      }
      g.append(s("polyline", { points: line.map((p) => `${X(p.x)},${Y(p.y)}`).join(" "), fill: "none",
        stroke: color, "stroke-width": 2, "stroke-dasharray": dash || null }));
      const last = line[line.length - 1];
      const label = s("text", { x: W - m.r + 4, y: Y(last.y) + 4, class: "series-label", fill: color }, sr.short || sr.label);
      ends.push(label);
      g.append(label);
    }
    for (const p of sr.points) {
      if (p.std && (sr.connect === false || p.connect === false)) {
        g.append(s("line", { x1: X(p.x), x2: X(p.x), y1: Y(p.y - p.std), y2: Y(p.y + p.std), stroke: color, "stroke-width": 1.5 }));
      }
      const mk = marker(shape, X(p.x), Y(p.y), 4.5, color, { class: "point", "data-x": p.x, "data-value": p.y,
        "data-std": p.std ?? "", "data-name": p.name ?? "", ...(p.attrs || {}) });
      mk.append(s("title", {}, `${sr.label}, ${p.name ?? p.x}: ${yf(p.y)}${p.std ? ` ± ${yf(p.std)}` : ""}`));
      g.append(mk);
      if (p.label) g.append(s("text", { x: X(p.x) + 8, y: Y(p.y) - 6, class: "series-label", fill: color }, p.label));
    }
    svg.append(g);
  });
  ends.sort((a, b) => a.getAttribute("y") - b.getAttribute("y"));
  ends.forEach((el, i) => {
    if (i && el.getAttribute("y") - ends[i - 1].getAttribute("y") < 13) el.setAttribute("y", Number(ends[i - 1].getAttribute("y")) + 13);
  });
  if (opts.mark) {
    const sr = opts.series.find((x) => x.id === opts.mark.series);
    const p = sr && sr.points.find((q) => q.x === opts.mark.x);
    if (p) {
      svg.append(s("g", { class: "best-mark", "data-series": sr.id, "data-x": p.x, "data-value": p.y },
        s("circle", { cx: X(p.x), cy: Y(p.y), r: 11, fill: "none", stroke: "#000", "stroke-width": 2 }),
        s("text", { x: X(p.x), y: Y(p.y) - 16, "text-anchor": "middle", class: "mark-label" }, opts.mark.label || "best")));
    }
  }
  return svg;
}

// A legend in HTML under a chart: a sample of each series' dash and marker, then its name.
export function legend(series) {
  const ul = document.createElement("ul");
  ul.className = "legend";
  series.forEach((sr, i) => {
    const color = sr.color || COLORS[i % COLORS.length], dash = sr.dash ?? DASHES[i % DASHES.length];
    const sw = s("svg", { viewBox: "0 0 36 12", width: 36, height: 12, "aria-hidden": "true" },
      s("line", { x1: 0, x2: 36, y1: 6, y2: 6, stroke: color, "stroke-width": 2, "stroke-dasharray": dash || null }),
      marker(sr.marker || MARKERS[i % MARKERS.length], 18, 6, 4, color, {}));
    const li = document.createElement("li");
    li.append(sw, ` ${sr.label}`);
    ul.append(li);
  });
  return ul;
}

// Horizontal bars: [{label, value, text}]; log: a log10 scale for sizes that span decades.
export function bars(items, { title = "bars", log = false, max = null } = {}) {
  const rowH = 26, W = 760, left = 190, right = 130, H = items.length * rowH + 10;
  const v = (x) => (log ? Math.log10(Math.max(x, 1)) : x);
  const top = max ?? Math.max(...items.map((it) => v(it.value)), 1e-9);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart bars", role: "img" });
  svg.append(s("title", {}, title));
  items.forEach((it, i) => {
    const w = Math.max(1, ((W - left - right) * v(it.value)) / top);
    const y = 5 + i * rowH;
    svg.append(s("g", { class: "bar", "data-label": it.label, "data-value": it.value },
      s("text", { x: left - 8, y: y + 16, "text-anchor": "end", class: "tick" }, it.label),
      s("rect", { x: left, y: y + 3, width: w, height: rowH - 8, fill: it.color || COLORS[0] }),
      s("text", { x: left + w + 6, y: y + 16, class: "tick" }, it.text ?? String(it.value))));
  });
  return svg;
}

// A histogram from bin edges and counts; `limit` draws a labelled line (e.g. max_length).
export function histogram(edges, counts, { title = "histogram", xLabel = "", limit = null } = {}) {
  const W = 760, H = 260, m = { l: 50, r: 20, t: 14, b: 44 };
  const hi = Math.max(edges[edges.length - 1], limit && limit <= edges[edges.length - 1] * 1.5 ? limit : 0);
  const top = Math.max(...counts, 1);
  const X = (x) => m.l + (x / hi) * (W - m.l - m.r);
  const Y = (c) => H - m.b - (c / top) * (H - m.t - m.b);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img" });
  svg.append(s("title", {}, title));
  counts.forEach((c, i) => {
    const r = s("rect", { class: "bin", x: X(edges[i]) + 1, y: Y(c), width: Math.max(1, X(edges[i + 1]) - X(edges[i]) - 2),
      height: H - m.b - Y(c), fill: COLORS[0], "data-from": edges[i], "data-to": edges[i + 1], "data-count": c });
    r.append(s("title", {}, `${edges[i]}–${edges[i + 1] - 1} tokens: ${c} texts`));
    svg.append(r);
  });
  for (const v of niceTicks(0, top, 4)) {
    svg.append(s("text", { x: m.l - 6, y: Y(v) + 4, "text-anchor": "end", class: "tick" }, v));
  }
  for (const v of niceTicks(0, hi, 8)) {
    svg.append(s("text", { x: X(v), y: H - m.b + 17, "text-anchor": "middle", class: "tick" }, v));
  }
  svg.append(s("line", { x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b, stroke: "#333" }),
    s("text", { x: (m.l + W - m.r) / 2, y: H - 6, "text-anchor": "middle", class: "axis-label" }, xLabel));
  if (limit && limit <= hi) {
    svg.append(s("line", { x1: X(limit), x2: X(limit), y1: m.t, y2: H - m.b, stroke: "#c0392b", "stroke-dasharray": "4 3" }),
      s("text", { x: X(limit) - 4, y: m.t + 10, "text-anchor": "end", class: "tick" }, `max_length ${limit}`));
  }
  return svg;
}
