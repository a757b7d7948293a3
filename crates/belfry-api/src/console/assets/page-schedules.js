// Schedules: a tenant's recurring schedules with their next occurrence,
// pause and resume; one schedule with its next instants and its history.

import { api, query, seg, tenantPath } from './api.js';
import {
  badge, busy, button, field, fields, h, hashLink, instant, instantWithAge, localTime, pageHead, panel, table,
} from './dom.js';
import { PAGE_SIZE, pager } from './page-events.js';

/** How many coming instants the detail shows. */
const UPCOMING = 10;

function schedulePath(schedule, rest = '') {
  return tenantPath(schedule.tenant, `/schedules/${seg(schedule.id)}${rest}`);
}

/** Pause or Resume, whichever applies; `after` runs once it took effect. */
function pauseResume(ctx, schedule, after) {
  if (!ctx.canWrite) return null;
  if (schedule.status === 'active') {
    const element = button('Pause', () => busy(element,
      () => api(schedulePath(schedule, '/pause'), { method: 'POST' }), after), { write: true });
    return element;
  }
  if (schedule.status === 'paused') {
    const element = button('Resume', () => busy(element,
      () => api(schedulePath(schedule, '/resume'), { method: 'POST' }), after), { kind: 'primary', write: true });
    return element;
  }
  return null;
}

function nextOccurrence(schedule) {
  if (!schedule.next_occurrence) return h('span', { class: 'muted' }, schedule.status === 'paused' ? 'paused' : 'none');
  return h('span', {},
    instantWithAge(schedule.next_occurrence),
    schedule.next_occurrence_local ? h('div', { class: 'muted small' }, `${localTime(schedule.next_occurrence_local)} ${schedule.time_zone}`) : null);
}

async function renderList(container, ctx) {
  const tenant = await ctx.tenant();
  container.append(pageHead('Schedules', 'Recurring schedules: each occurrence becomes an ordinary event before it is due.'));
  if (!tenant) {
    container.append(panel(null, h('p', { class: 'muted' }, 'No tenant is registered yet.')));
    return;
  }
  const picker = await ctx.tenantPicker(tenant, (name) => ctx.go('schedules', [], { tenant: name }));
  const answer = await api(tenantPath(tenant, `/schedules${query({ cursor: ctx.params.get('cursor'), limit: PAGE_SIZE })}`));
  const reload = () => ctx.go('schedules', [], Object.fromEntries(ctx.params));
  const columns = [
    { label: 'Schedule', class: 'id', cell: (s) => h('a', { href: hashLink('schedules', [s.tenant, s.id]) }, s.id) },
    { label: 'Expression', cell: (s) => h('span', {}, h('span', { class: 'mono' }, s.expression), h('div', { class: 'muted small' }, s.description ?? '')) },
    { label: 'Time zone', cell: (s) => s.time_zone },
    { label: 'Status', cell: (s) => badge(s.status) },
    { label: 'Next occurrence (UTC)', cell: nextOccurrence },
    { label: 'Occurrences', class: 'num', cell: (s) => s.occurrences },
    { label: '', cell: (s) => pauseResume(ctx, s, reload) },
  ];
  container.append(
    panel(null, h('form', { class: 'filters' }, field('Tenant', picker))),
    panel(null,
      table(columns, answer.schedules, { empty: 'This tenant has no schedule.', rowAttrs: (s) => ({ dataset: { schedule: s.id } }) }),
      pager('schedules', [], new URLSearchParams({ ...Object.fromEntries(ctx.params), tenant }), answer.next_cursor)),
  );
}

const OCCURRENCE_COLUMNS = [
  { label: 'Due at (UTC)', cell: (o) => instant(o.scheduled_at) },
  { label: 'Status', cell: (o) => badge(o.status) },
  { label: 'Attempts', class: 'num', cell: (o) => o.attempts },
  { label: 'Last error', class: 'error', cell: (o) => o.last_error ?? '' },
  { label: 'Event', class: 'id', cell: (o) => h('span', { class: 'mono small' }, o.id) },
];

async function renderDetail(container, ctx) {
  const [tenant, id] = ctx.segments;
  const body = h('div');
  container.append(body);
  const draw = async () => {
    const schedule = await api(tenantPath(tenant, `/schedules/${seg(id)}`));
    const [upcoming, history] = await Promise.all([
      api(`/v1/cron/preview${query({
        expression: schedule.expression, type: schedule.type, timezone: schedule.time_zone, count: UPCOMING,
      })}`),
      api(schedulePath(schedule, `/occurrences${query({ cursor: ctx.params.get('cursor'), limit: PAGE_SIZE })}`)),
    ]);
    const refresh = button('Refresh', () => busy(refresh, draw));
    body.replaceChildren(
      pageHead(`Schedule ${schedule.id}`, h('span', {}, 'tenant ',
        h('a', { href: hashLink('schedules', [], { tenant }) }, tenant)), pauseResume(ctx, schedule, draw), refresh),
      panel(null, fields([
        ['Status', badge(schedule.status)],
        ['Expression', h('span', { class: 'mono' }, `${schedule.expression} (${schedule.type})`)],
        ['Means', schedule.description],
        ['Time zone', schedule.time_zone],
        ['Next occurrence (UTC)', nextOccurrence(schedule)],
        ['Misfire policy', schedule.misfire.cap ? `${schedule.misfire.policy} (at most ${schedule.misfire.cap})` : schedule.misfire.policy],
        ['Occurrences so far', String(schedule.occurrences)],
        ['Last occurrence', instant(schedule.last_occurrence)],
        ['Starts / ends', `${instant(schedule.start_at)} / ${instant(schedule.end_at)}`],
        ['Error', schedule.error],
      ])),
      panel(`The expression's next ${UPCOMING} instants`,
        table([
          { label: 'UTC', cell: (o) => instant(o.utc) },
          { label: `Local (${schedule.time_zone})`, cell: (o) => localTime(o.local) },
        ], upcoming.occurrences, { empty: 'The expression has no further instant.' }),
        schedule.status === 'paused' ? h('p', { class: 'muted small' }, 'Paused: none of these fires until it is resumed.') : null),
      panel('History',
        table(OCCURRENCE_COLUMNS, history.occurrences, { empty: 'No occurrence yet.' }),
        pager('schedules', [tenant, id], ctx.params, history.next_cursor)),
    );
  };
  await draw();
}

export default {
  name: 'schedules',
  title: 'Schedules',
  render(container, ctx) {
    return ctx.segments.length >= 2 ? renderDetail(container, ctx) : renderList(container, ctx);
  },
};
