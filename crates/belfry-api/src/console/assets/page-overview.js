// Overview (admin): this node's `GET /metrics`, scraped every few seconds
// while the page is shown. Rates and lateness quantiles are computed
// between consecutive scrapes and kept in a ring buffer here (it survives
// navigating away and back), then plotted.

import { api } from './api.js';
import { legend, lineChart } from './chart.js';
import { duration, h, number, pageHead, panel } from './dom.js';
import { buckets, parse, quantileBetween, rate, total } from './prom.js';

const SCRAPE_MS = 2000;
/** Five minutes of samples. */
const KEEP = 150;
const SPAN_MS = KEEP * SCRAPE_MS;
const MIN_SPAN_MS = 60000;
/** Scrapes further apart than this are not compared. */
const GAP_MS = 3 * SCRAPE_MS;

/** Computed samples, oldest first. */
const history = [];
/** The previous scrape's raw counters. */
let previous = null;

/** The raw values of one scrape that rates and quantiles need. */
function raw(samples) {
  const deliveries = (outcome) => total(samples, 'belfry_deliveries_total', { outcome });
  const requests = (prefix) => (samples.get('belfry_http_requests_total') ?? [])
    .filter((s) => s.labels.status?.startsWith(prefix))
    .reduce((sum, s) => sum + s.value, 0);
  return {
    t: Date.now(),
    delivered: deliveries('delivered') ?? 0,
    retry: deliveries('retry') ?? 0,
    permanent: deliveries('permanent') ?? 0,
    dead: total(samples, 'belfry_events_ended_total', { status: 'failed' }) ?? 0,
    lateness: buckets(samples, 'belfry_fire_lateness_seconds', { attempt: 'first' }),
    ok: requests('2') + requests('3'),
    clientErrors: requests('4'),
    serverErrors: requests('5'),
    gauges: {
      inFlight: total(samples, 'belfry_deliveries_in_flight'),
      outstanding: total(samples, 'belfry_fired_outstanding'),
      window: total(samples, 'belfry_window_entries'),
      capacity: total(samples, 'belfry_window_capacity'),
      overdue: total(samples, 'belfry_overdue_events'),
      oldestOverdue: total(samples, 'belfry_oldest_overdue_age_seconds'),
      partitions: total(samples, 'belfry_partitions_owned'),
    },
  };
}

async function scrape() {
  const now = raw(parse(await api('/metrics', { text: true })));
  const sample = { t: now.t, ...now.gauges, deadTotal: now.dead };
  if (previous && now.t - previous.t > GAP_MS) {
    // The page was left meanwhile: a rate over the whole absence would
    // smear it, so the plots show a gap instead.
    history.push({ t: now.t, gap: true });
  } else if (previous) {
    const seconds = (now.t - previous.t) / 1000;
    const per = (name) => rate(now[name], previous[name], seconds);
    Object.assign(sample, {
      delivered: per('delivered'),
      retry: per('retry'),
      permanent: per('permanent'),
      ok: per('ok'),
      clientErrors: per('clientErrors'),
      serverErrors: per('serverErrors'),
      p50: ms(quantileBetween(now.lateness, previous.lateness, 0.5)),
      p99: ms(quantileBetween(now.lateness, previous.lateness, 0.99)),
    });
    history.push(sample);
  }
  while (history.length > KEEP) history.shift();
  previous = now;
  return sample;
}

function ms(seconds) {
  return seconds === null ? null : seconds * 1000;
}

function card(label, value, hint, bad = false) {
  return h('div', { class: `panel card${bad ? ' bad' : ''}` },
    h('div', { class: 'label' }, label), h('div', { class: 'value' }, value), hint ? h('div', { class: 'hint' }, hint) : null);
}

function cards(latest) {
  const last = history[history.length - 1] ?? {};
  const overdue = latest.overdue ?? 0;
  return h('div', { class: 'grid cards' },
    card('Delivered / s', number(last.delivered), 'attempts answered 2xx'),
    card('Lateness p99', last.p99 === null || last.p99 === undefined ? '-' : `${number(last.p99)} ms`,
      'first attempts, last interval'),
    card('In flight', number(latest.inFlight), `${number(latest.outstanding)} fired, not finished`),
    card('Pending (in window)', number(latest.window),
      latest.capacity ? `held in memory, of ${number(latest.capacity)}` : 'held in memory'),
    card('Overdue', number(overdue), 'due, not fired yet', overdue > 0),
    card('Oldest overdue', latest.oldestOverdue ? duration(latest.oldestOverdue * 1000) : '0 s', null,
      latest.oldestOverdue > 5),
    card('Dead events', number(latest.deadTotal), 'failed since the node started'),
    card('Partitions owned', number(latest.partitions), 'by this node'));
}

/** The plots' time span: what has been collected, from one to five minutes. */
function span() {
  const collected = history.length ? Date.now() - history[0].t : 0;
  return Math.min(SPAN_MS, Math.max(MIN_SPAN_MS, Math.ceil(collected / 60000) * 60000));
}

function chart(title, unit, series, format) {
  const points = series.map(({ name, key }) => ({ name, points: history.map((s) => [s.t, s[key] ?? null]) }));
  const latest = (s) => {
    const value = s.points.length ? s.points[s.points.length - 1][1] : null;
    return value === null ? null : `${number(value)}${unit}`;
  };
  return panel(title, lineChart({ title, series: points, spanMs: span(), format }), legend(points, latest));
}

function charts() {
  const plain = (v) => number(v);
  return h('div', { class: 'grid charts' },
    chart('Deliveries per second', '/s', [
      { name: 'delivered', key: 'delivered' },
      { name: 'retry', key: 'retry' },
      { name: 'permanent failure', key: 'permanent' },
    ], plain),
    chart('Fire lateness, first attempts (ms)', ' ms', [
      { name: 'p50', key: 'p50' },
      { name: 'p99', key: 'p99' },
    ], plain),
    chart('Work in progress', '', [
      { name: 'in flight', key: 'inFlight' },
      { name: 'fired, not finished', key: 'outstanding' },
      { name: 'overdue', key: 'overdue' },
    ], plain),
    chart('API requests per second', '/s', [
      { name: '2xx/3xx', key: 'ok' },
      { name: '4xx', key: 'clientErrors' },
      { name: '5xx', key: 'serverErrors' },
    ], plain));
}

export default {
  name: 'overview',
  title: 'Overview',
  admin: true,
  async render(container, ctx) {
    const body = h('div');
    container.append(pageHead('Overview',
      `This node, scraped from /metrics every ${SCRAPE_MS / 1000} s; the plots keep the last ${SPAN_MS / 60000} minutes.`),
    body);
    const draw = (latest) => body.replaceChildren(cards(latest), charts());
    let latest = await scrape();
    if (history.length === 0 || history[history.length - 1].gap) {
      // Rates need two scrapes: take the second one soon.
      await new Promise((resolve) => { setTimeout(resolve, 1000); });
      if (!ctx.alive()) return;
      latest = await scrape();
    }
    draw(latest);
    ctx.every(SCRAPE_MS, async () => draw(await scrape()));
  },
};
