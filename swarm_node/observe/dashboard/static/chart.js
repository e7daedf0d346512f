// A small SVG line chart: axes, "nice" ticks, one polyline per series. No dependencies.
// lineChart(svg, series, opts): series = [{points: [[x, y], ...], color, dash, peer, key}]; a series may add
// `bars: [[x, lo, hi], ...]` (error bars: an interval at each point, drawn with its point marked).
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

function svgEl(tag, attrs, parent) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  if (parent) parent.appendChild(el);
  return el;
}

// About `count` round tick values covering [lo, hi].
function niceTicks(lo, hi, count) {
  if (hi <= lo) { hi = lo + 1; }
  const raw = (hi - lo) / count;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((f) => f * mag).find((s) => s >= raw);
  const ticks = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) ticks.push(+v.toPrecision(12));
  return ticks;
}

function fmtTick(v) {
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(0);
  return String(+v.toPrecision(4));
}

function lineChart(svg, series, opts) {
  const W = 480, H = 220, L = 48, R = 10, T = 10, B = 28;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("class", "plot");
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const pts = series.flatMap((s) => [...s.points, ...(s.bars || []).flatMap((b) => [[b[0], b[1]], [b[0], b[2]]])]);
  if (pts.length === 0) {
    svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }, svg).textContent = "no data yet";
    return;
  }
  let [x0, x1] = [Math.min(...pts.map((p) => p[0])), Math.max(...pts.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...pts.map((p) => p[1])), Math.max(...pts.map((p) => p[1]))];
  if (opts && opts.yMin !== undefined) y0 = Math.min(y0, opts.yMin);
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const pad = (y1 - y0) * 0.05;
  y1 += pad; if (!(opts && opts.yMin === y0)) y0 -= pad;
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);

  for (const t of niceTicks(y0, y1, 4)) {
    svgEl("line", { x1: L, x2: W - R, y1: sy(t), y2: sy(t), class: "grid" }, svg);
    svgEl("text", { x: L - 4, y: sy(t) + 4, "text-anchor": "end" }, svg).textContent = fmtTick(t);
  }
  for (const t of niceTicks(x0, x1, 6)) {
    svgEl("text", { x: sx(t), y: H - B + 14, "text-anchor": "middle" }, svg).textContent = fmtTick(t);
  }
  svgEl("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }, svg);
  svgEl("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }, svg);
  svgEl("text", { x: W - R, y: H - 2, "text-anchor": "end" }, svg).textContent = (opts && opts.xLabel) || "step";

  const barred = series.filter((s) => s.bars && s.points.length);
  for (const s of series) {
    if (s.points.length === 0) continue;
    // series with error bars are shifted apart by a few pixels, so bars at one step do not hide each other
    const dx = s.bars ? (barred.indexOf(s) - (barred.length - 1) / 2) * 4 : 0;
    const px = (x) => sx(x) + dx;
    const attr = {
      points: s.points.map((p) => `${px(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" "),
      stroke: s.color, "data-peer": s.peer, "data-key": s.key, "data-n": s.points.length,
    };
    if (s.dash) attr["stroke-dasharray"] = s.dash;
    svgEl("polyline", attr, svg);
    const last = s.points[s.points.length - 1];
    svgEl("circle", { cx: px(last[0]), cy: sy(last[1]), r: 2.5, fill: s.color }, svg);
    for (const [x, lo, hi] of s.bars || []) errorBar(svg, px(x), sy(lo), sy(hi), s);
    if (s.bars) for (const [x, y] of s.points) svgEl("circle", { cx: px(x), cy: sy(y), r: 2.5, fill: s.color }, svg);
  }
}

// A vertical bar from y `top` to `bottom` at x, with caps, in the series' colour.
function errorBar(svg, x, bottom, top, s) {
  const attrs = { stroke: s.color, class: "errbar", "data-peer": s.peer };
  svgEl("line", { ...attrs, x1: x, x2: x, y1: top, y2: bottom }, svg);
  for (const y of [top, bottom]) svgEl("line", { ...attrs, x1: x - 3, x2: x + 3, y1: y, y2: y }, svg);
}

window.lineChart = lineChart;
