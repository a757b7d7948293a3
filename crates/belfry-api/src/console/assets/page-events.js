// Events: a tenant's events filtered by status and instant, a page at a
// time (the API's cursor), and one event with every attempt.

import { api, query, seg, tenantPath } from './api.js';
import {
  badge, busy, button, confirmButton, field, fields, h, hashLink, instant, instantWithAge,
  localInputToRfc3339, pageHead, panel, rfc3339ToLocalInput, select, table,
} from './dom.js';

export const PAGE_SIZE = 50;

export const STATUSES = ['scheduled', 'retrying', 'delivered', 'failed', 'missed', 'cancelled', 'expired'];

/** `POST …/events/{id}/redrive`: a failed or missed event, sent again now. */
export function redrive(tenant, id) {
  return api(tenantPath(tenant, `/events/${seg(id)}/redrive`), { method: 'POST' });
}

/** `POST …/events/{id}/delete`: a finished event, deleted with its history. */
export function deleteEvent(tenant, id) {
  return api(tenantPath(tenant, `/events/${seg(id)}/delete`), { method: 'POST' });
}

/** The filter form shared by the event and dead-letter lists. */
export async function filterForm(ctx, page, tenant, { statuses = STATUSES, anyStatus = true } = {}) {
  const params = ctx.params;
  const picker = await ctx.tenantPicker(tenant, () => {});
  const options = statuses.map((s) => [s, s]);
  const status = select('status', anyStatus ? [['', 'any'], ...options] : options, params.get('status') ?? '');
  const from = h('input', { type: 'datetime-local', name: 'from', step: 1, value: rfc3339ToLocalInput(params.get('from')) });
  const to = h('input', { type: 'datetime-local', name: 'to', step: 1, value: rfc3339ToLocalInput(params.get('to')) });
  return h('form', {
    class: 'filters',
    on: {
      submit: (event) => {
        event.preventDefault();
        ctx.go(page, [], {
          tenant: picker.value,
          status: status.value,
          from: localInputToRfc3339(from.value),
          to: localInputToRfc3339(to.value),
        });
      },
    },
  },
  field('Tenant', picker),
  field('Status', status),
  field('Due from (your time)', from),
  field('Due before (your time)', to),
  h('button', { type: 'submit', class: 'primary' }, 'Search'));
}

/** "First page" / "Next page" links over the API's cursor. */
export function pager(page, segments, params, nextCursor) {
  const base = Object.fromEntries([...params.entries()].filter(([name]) => name !== 'cursor'));
  return h('div', { class: 'pager' },
    params.get('cursor') ? h('a', { href: hashLink(page, segments, base) }, '« First page') : null,
    nextCursor ? h('a', { href: hashLink(page, segments, { ...base, cursor: nextCursor }), rel: 'next' }, 'Next page »') : null);
}

/** The query of a list call from the page's parameters. */
export function listQuery(params, limit = PAGE_SIZE) {
  return query({
    status: params.get('status'),
    from: params.get('from'),
    to: params.get('to'),
    cursor: params.get('cursor'),
    limit,
  });
}

function eventLink(event) {
  return h('a', { href: hashLink('events', [event.tenant, event.id]) }, event.id);
}

export const EVENT_COLUMNS = [
  { label: 'Event', class: 'id', cell: eventLink },
  { label: 'Status', cell: (e) => badge(e.status) },
  { label: 'Due at (UTC)', cell: (e) => instant(e.deliver_at) },
  { label: 'Attempts', class: 'num', cell: (e) => e.attempts },
  { label: 'Last error', class: 'error', cell: (e) => e.last_error ?? '' },
  { label: 'Updated (UTC)', cell: (e) => instant(e.updated_at) },
];

async function renderList(container, ctx) {
  const tenant = await ctx.tenant();
  container.append(pageHead('Events', 'Search a tenant\'s events by status and due time.'));
  if (!tenant) {
    container.append(panel(null, h('p', { class: 'muted' }, 'No tenant is registered yet.')));
    return;
  }
  const form = await filterForm(ctx, 'events', tenant);
  const answer = await api(tenantPath(tenant, `/events${listQuery(ctx.params)}`));
  container.append(
    panel(null, form),
    panel(null,
      table(EVENT_COLUMNS, answer.events, { empty: 'No event matches.' }),
      pager('events', [], new URLSearchParams({ ...Object.fromEntries(ctx.params), tenant }), answer.next_cursor)),
  );
}

const ATTEMPT_COLUMNS = [
  { label: '#', class: 'num', cell: (a) => (a.number === 0 ? '-' : a.number) },
  { label: 'Started (UTC)', cell: (a) => instant(a.started_at) },
  { label: 'Took', class: 'num', cell: (a) => `${a.duration_ms} ms` },
  { label: 'Outcome', cell: (a) => badge(a.outcome) },
  { label: 'HTTP', class: 'num', cell: (a) => a.http_status ?? '-' },
  { label: 'Error', class: 'error', cell: (a) => a.error ?? '' },
  { label: 'Version', cell: (a) => h('span', { class: 'mono small' }, a.version) },
];

async function renderDetail(container, ctx) {
  const [tenant, id] = ctx.segments;
  const path = tenantPath(tenant, `/events/${seg(id)}`);
  const body = h('div');
  container.append(body);
  let shown = null;
  const draw = async () => {
    const [event, history] = await Promise.all([api(path), api(`${path}/attempts`)]);
    const actions = [];
    if (ctx.canWrite && (event.status === 'failed' || event.status === 'missed')) {
      const redriveButton = button('Redrive', () => busy(redriveButton, () => redrive(tenant, id), draw),
        { kind: 'primary', write: true, title: 'Send it again now, as a new version' });
      actions.push(redriveButton);
    }
    if (ctx.canWrite && pending(event)) {
      actions.push(confirmButton('Cancel event', 'Really cancel?',
        (element) => busy(element, () => api(path, { method: 'DELETE' }), draw), { write: true }));
    }
    const refresh = button('Refresh', () => busy(refresh, draw));
    actions.push(refresh);
    body.replaceChildren(
      pageHead(`Event ${event.id}`, h('span', {}, 'tenant ',
        h('a', { href: hashLink('events', [], { tenant }) }, tenant)), ...actions),
      panel(null, fields([
        ['Status', badge(event.status)],
        ['Due at (UTC)', instantWithAge(event.deliver_at)],
        ['Attempts', String(event.attempts)],
        ['Next attempt', event.next_attempt_at ? instantWithAge(event.next_attempt_at) : null],
        ['Last error', event.last_error],
        ['First fired', instant(event.triggered_at)],
        ['Finished', instant(event.finished_at)],
        ['Created', instant(event.created_at)],
        ['Updated', instant(event.updated_at)],
        ['Version (idempotency key)', h('span', { class: 'mono' }, event.version)],
        ['Delivery', event.delivery],
      ])),
      panel('Payload', event.payload === null ? h('p', { class: 'muted' }, 'No payload.') : h('pre', {}, event.payload)),
      panel(`Attempts (${history.attempts.length})`,
        table(ATTEMPT_COLUMNS, history.attempts, { empty: 'No attempt yet.' })),
    );
    shown = event;
  };
  await draw();
  // While it is pending and due within a minute (also after a redrive
  // here), follow it.
  ctx.every(2000, async () => {
    const next = Date.parse(shown.next_attempt_at ?? shown.deliver_at);
    if (pending(shown) && next - Date.now() < 60000) await draw();
  });
}

function pending(event) {
  return event.status === 'scheduled' || event.status === 'retrying';
}

export default {
  name: 'events',
  title: 'Events',
  render(container, ctx) {
    return ctx.segments.length >= 2 ? renderDetail(container, ctx) : renderList(container, ctx);
  },
};
