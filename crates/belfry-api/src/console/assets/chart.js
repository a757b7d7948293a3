// A small SVG line chart over time: no library, drawn with DOM calls.

const NS = 'http://www.w3.org/2000/svg';
const WIDTH = 640;
const HEIGHT = 220;
const PAD = { left: 56, right: 24, top: 12, bottom: 26 };
/** Time-axis spacings, in seconds: whole seconds below a minute, whole minutes above. */
const TIME_TICKS_S = [5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];

function svg(tag, attrs = {}, text) {
  const element = document.createElementNS(NS, tag);
  for (const [name, value] of Object.entries(attrs)) element.setAttribute(name, String(value));
  if (text !== undefined) element.textContent = text;
  return element;
}

/** 1, 2 or 5 times a power of ten, at least `raw`. */
function niceStep(raw) {
  const power = 10 ** Math.floor(Math.log10(raw));
  for (const factor of [1, 2, 5, 10]) {
    if (factor * power >= raw) return factor * power;
  }
  return 10 * power;
}

/**
 * A chart of `series` (`[{name, points: [[timeMs, value|null], …]}]`,
 * a null value is a gap) over the last `spanMs` ending at `nowMs`.
 * `format` renders y values. The element carries `data-points`: the most
 * points any series has (tests wait for it).
 */
export function lineChart({ title, series, spanMs, nowMs = Date.now(), format = String, minMax = 1 }) {
  const values = series.flatMap((s) => s.points.map(([, v]) => v)).filter((v) => v !== null && Number.isFinite(v));
  const top = Math.max(minMax, ...values);
  const step = niceStep(top / 4);
  const yMax = step * Math.ceil(top / step);
  const x0 = PAD.left;
  const x1 = WIDTH - PAD.right;
  const y0 = HEIGHT - PAD.bottom;
  const y1 = PAD.top;
  const start = nowMs - spanMs;
  const x = (t) => x0 + ((t - start) / spanMs) * (x1 - x0);
  const y = (v) => y0 - (v / yMax) * (y0 - y1);

  const chart = svg('svg', { class: 'chart', viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: 'img', 'aria-label': title });
  chart.dataset.points = String(Math.max(0, ...series.map((s) => s.points.length)));
  for (let v = 0; v <= yMax + step / 2; v += step) {
    chart.append(svg('line', { class: v === 0 ? 'axis' : 'gridline', x1: x0, x2: x1, y1: y(v), y2: y(v) }));
    chart.append(svg('text', { x: x0 - 6, y: y(v) + 4, 'text-anchor': 'end' }, format(v)));
  }
  chart.append(svg('line', { class: 'axis', x1: x0, x2: x0, y1: y0, y2: y1 }));
  const tickMs = TIME_TICKS_S.find((s) => s * 1000 >= spanMs / 6) * 1000 || spanMs;
  for (let ago = 0; ago <= spanMs; ago += tickMs) {
    const tx = x(nowMs - ago);
    chart.append(svg('line', { class: 'axis', x1: tx, x2: tx, y1: y0, y2: y0 + 4 }));
    const label = ago === 0 ? 'now' : `-${ago >= 60000 ? `${ago / 60000} min` : `${ago / 1000} s`}`;
    chart.append(svg('text', { x: tx, y: y0 + 17, 'text-anchor': 'middle' }, label));
  }
  series.forEach((s, index) => {
    const colour = `s${index % 5}`;
    // Runs of consecutive values; a run of one (between gaps) is a dot.
    const runs = [[]];
    for (const [t, v] of s.points) {
      if (v === null || !Number.isFinite(v) || t < start) {
        if (runs[runs.length - 1].length) runs.push([]);
      } else {
        runs[runs.length - 1].push([x(t).toFixed(1), y(v).toFixed(1)]);
      }
    }
    for (const run of runs) {
      if (run.length === 1) {
        chart.append(svg('circle', { class: `dot ${colour}`, cx: run[0][0], cy: run[0][1], r: 3 }));
      } else if (run.length > 1) {
        const d = run.map(([px, py], i) => `${i ? 'L' : 'M'}${px},${py}`).join('');
        chart.append(svg('path', { class: `line ${colour}`, d }));
      }
    }
  });
  if (values.length === 0) {
    chart.append(svg('text', { class: 'nodata', x: (x0 + x1) / 2, y: (y0 + y1) / 2, 'text-anchor': 'middle' },
      'collecting samples…'));
  }
  return chart;
}

/** The legend of `series` (same colours as the chart). */
export function legend(series, latest = (s) => null) {
  const element = document.createElement('div');
  element.className = 'legend';
  series.forEach((s, index) => {
    const item = document.createElement('span');
    const swatch = document.createElement('span');
    swatch.className = `swatch s${index % 5}`;
    item.append(swatch, document.createTextNode(s.name));
    const value = latest(s);
    if (value !== null && value !== undefined) item.append(document.createTextNode(`: ${value}`));
    element.append(item);
  });
  return element;
}
