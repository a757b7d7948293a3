// Reading `GET /metrics` (Prometheus text format 0.0.4): the few series
// the overview plots, rates between two scrapes, histogram quantiles.

/** One sample: `{name, labels: {..}, value}`. */
function parseLine(line) {
  let i = 0;
  while (i < line.length && line[i] !== '{' && line[i] !== ' ') i += 1;
  const name = line.slice(0, i);
  const labels = {};
  if (line[i] === '{') {
    i += 1;
    while (i < line.length && line[i] !== '}') {
      const eq = line.indexOf('=', i);
      if (eq < 0) return null;
      const label = line.slice(i, eq).trim();
      i = eq + 2; // past `="`
      let value = '';
      while (i < line.length && line[i] !== '"') {
        if (line[i] === '\\' && i + 1 < line.length) {
          const next = line[i + 1];
          value += next === 'n' ? '\n' : next;
          i += 2;
        } else {
          value += line[i];
          i += 1;
        }
      }
      labels[label] = value;
      i += 1; // past the closing quote
      if (line[i] === ',') i += 1;
    }
    i += 1; // past `}`
  }
  // `NaN`, `+Inf` and `-Inf` are values too; a timestamp may follow.
  const value = Number(line.slice(i).trim().split(/\s+/)[0].replace('Inf', 'Infinity'));
  return name ? { name, labels, value } : null;
}

/** The exposition as a map from metric name to its samples. */
export function parse(text) {
  const samples = new Map();
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line || line.startsWith('#')) continue;
    const sample = parseLine(line);
    if (!sample) continue;
    if (!samples.has(sample.name)) samples.set(sample.name, []);
    samples.get(sample.name).push(sample);
  }
  return samples;
}

function matches(labels, filter) {
  return Object.entries(filter).every(([name, value]) => labels[name] === value);
}

/** The sum of `name`'s samples whose labels match `filter`; null if none. */
export function total(samples, name, filter = {}) {
  const found = (samples.get(name) ?? []).filter((s) => matches(s.labels, filter));
  return found.length ? found.reduce((sum, s) => sum + s.value, 0) : null;
}

/** Per second between two scrapes; a counter that went down restarted. */
export function rate(now, before, seconds) {
  if (now === null || before === null || seconds <= 0) return null;
  const delta = now >= before ? now - before : now;
  return delta / seconds;
}

/** `[[upperBound, cumulativeCount], …]` of a histogram, by bound. */
export function buckets(samples, name, filter = {}) {
  return (samples.get(`${name}_bucket`) ?? [])
    .filter((s) => matches(s.labels, filter))
    .map((s) => [s.labels.le === '+Inf' ? Infinity : Number(s.labels.le), s.value])
    .sort((a, b) => a[0] - b[0]);
}

/**
 * The `q` quantile of what a histogram observed between two scrapes
 * (Prometheus' interpolation inside the bucket); null when nothing was
 * observed. Above the last finite bound it answers that bound.
 */
export function quantileBetween(now, before, q) {
  if (now.length === 0) return null;
  const previous = new Map(before.map(([le, count]) => [le, count]));
  let reset = false;
  const delta = now.map(([le, count]) => {
    const d = count - (previous.get(le) ?? 0);
    if (d < 0) reset = true;
    return [le, d];
  });
  const counts = reset ? now : delta;
  const observed = counts[counts.length - 1][1];
  if (!(observed > 0)) return null;
  const rank = q * observed;
  let lower = 0;
  let below = 0;
  for (const [le, cumulative] of counts) {
    if (cumulative >= rank) {
      if (le === Infinity) return lower;
      const inBucket = cumulative - below;
      return inBucket > 0 ? lower + ((le - lower) * (rank - below)) / inBucket : le;
    }
    lower = le;
    below = cumulative;
  }
  return lower;
}
