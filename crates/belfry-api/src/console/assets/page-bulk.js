// Bulk actions: redrive, cancel, delete, pause or resume every event matching a
// filter, run by the node in the background; their progress, polled while
// any runs; a form to start one.

import { api, query, seg } from './api.js';
import {
  badge, busy, confirmButton, field, fields, h, hashLink, instant, localInputToRfc3339, number, pageHead,
  panel, select, table,
} from './dom.js';

const POLL_MS = 1000;
/** Each action and the statuses its filter may name (events or schedules), the first preselected. */
const ACTIONS = {
  redrive: ['failed', 'missed', ''],
  cancel: ['scheduled', 'retrying', ''],
  // A delete must name a finished status: nothing is deleted by omission.
  delete: ['failed', 'missed', 'delivered', 'cancelled'],
  pause: ['active', ''],
  resume: ['paused', ''],
};

function done(action) {
  return (action.succeeded ?? 0) + (action.skipped ?? 0) + (action.failed ?? 0);
}

function progress(action) {
  const bar = h('div');
  const matched = action.matched ?? 0;
  const share = matched > 0 ? Math.min(1, done(action) / matched) : (action.state === 'running' ? 0 : 1);
  // The CSSOM, not a style attribute: the page's CSP allows no inline style.
  bar.style.width = `${(share * 100).toFixed(1)}%`;
  return h('div', {},
    h('div', {
      class: `progress ${action.state}`, role: 'progressbar', 'aria-valuemin': 0, 'aria-valuemax': 100,
      'aria-valuenow': Math.round(share * 100),
    }, bar),
    h('div', { class: 'muted small' },
      `${number(done(action))} of ${number(matched)}: ${number(action.succeeded)} done, `
      + `${number(action.skipped)} skipped, ${number(action.failed)} failed`));
}

function filterText(filter = {}) {
  const parts = [filter.tenant, filter.status ? `status ${filter.status}` : null];
  if (filter.from || filter.to) parts.push(`due ${instant(filter.from)} … ${instant(filter.to)}`);
  return parts.filter(Boolean).join(', ');
}

function cancelButton(ctx, action, after) {
  if (!ctx.canWrite || action.state !== 'running') return null;
  return confirmButton('Cancel', 'Really stop it?', (element) => busy(element,
    () => api(`/v1/bulk-actions/${seg(action.id)}/cancel`, { method: 'POST' }), after), { write: true });
}

async function newForm(ctx) {
  const tenant = await ctx.tenant();
  const picker = await ctx.tenantPicker(tenant, () => {});
  const action = select('action', Object.keys(ACTIONS).map((a) => [a, a]), 'redrive');
  const status = h('select', { name: 'status' });
  const statusesOf = () => {
    status.replaceChildren(...ACTIONS[action.value].map((s) => h('option', { value: s }, s || 'any')));
  };
  statusesOf();
  action.addEventListener('change', statusesOf);
  const from = h('input', { type: 'datetime-local', name: 'from', step: 1 });
  const to = h('input', { type: 'datetime-local', name: 'to', step: 1 });
  const submit = h('button', { type: 'submit', class: 'primary', dataset: { write: '' } }, 'Start');
  return h('form', {
    class: 'filters',
    on: {
      submit: (event) => {
        event.preventDefault();
        busy(submit, () => api('/v1/bulk-actions', {
          method: 'POST',
          body: {
            action: action.value,
            filter: {
              tenant: picker.value,
              status: status.value || undefined,
              from: localInputToRfc3339(from.value) || undefined,
              to: localInputToRfc3339(to.value) || undefined,
            },
          },
        }), (created) => ctx.go('bulk', [created.id]));
      },
    },
  },
  field('Action', action), field('Tenant', picker), field('Status', status),
  field('Due from (your time)', from), field('Due before (your time)', to), submit);
}

async function renderList(container, ctx) {
  const body = h('div');
  container.append(pageHead('Bulk actions',
    'One change to every event (redrive, cancel, delete) or schedule (pause, resume) of a tenant that a filter matches, run by the node in the background.'));
  if (ctx.canWrite) container.append(panel('Start a bulk action', await newForm(ctx)));
  container.append(body);
  const draw = async () => {
    const answer = await api(`/v1/bulk-actions${query({ tenant: ctx.who.tenant, limit: 50, cursor: ctx.params.get('cursor') })}`);
    const columns = [
      { label: 'Bulk action', class: 'id', cell: (a) => h('a', { href: hashLink('bulk', [a.id]) }, a.id) },
      { label: 'Action', cell: (a) => a.action },
      { label: 'Filter', cell: (a) => filterText(a.filter) },
      { label: 'State', cell: (a) => badge(a.state) },
      { label: 'Progress', cell: progress },
      { label: 'By', cell: (a) => h('span', { class: 'mono small' }, a.created_by) },
      { label: 'Started (UTC)', cell: (a) => instant(a.created_at) },
      { label: '', cell: (a) => cancelButton(ctx, a, draw) },
    ];
    body.replaceChildren(panel(null,
      table(columns, answer.bulk_actions, { empty: 'No bulk action yet.', rowAttrs: (a) => ({ dataset: { bulk: a.id, state: a.state } }) }),
      answer.next_cursor ? h('div', { class: 'pager' },
        h('a', { href: hashLink('bulk', [], { cursor: answer.next_cursor }) }, 'Next page »')) : null));
    return answer.bulk_actions.some((a) => a.state === 'running');
  };
  let running = await draw();
  ctx.every(POLL_MS, async () => {
    if (running) running = await draw();
  });
}

async function renderDetail(container, ctx) {
  const [id] = ctx.segments;
  const body = h('div');
  container.append(body);
  const draw = async () => {
    const action = await api(`/v1/bulk-actions/${seg(id)}`);
    body.replaceChildren(
      pageHead(`Bulk action ${action.id}`, h('a', { href: hashLink('bulk') }, 'All bulk actions'), cancelButton(ctx, action, draw)),
      panel(null, h('div', { dataset: { bulk: action.id, state: action.state } }, fields([
        ['Action', action.action],
        ['Filter', filterText(action.filter)],
        ['State', badge(action.state)],
        ['Progress', progress(action)],
        ['Matched', number(action.matched)],
        ['Succeeded', number(action.succeeded)],
        ['Skipped (no longer matching)', number(action.skipped)],
        ['Failed', number(action.failed)],
        ['Started by', h('span', { class: 'mono' }, action.created_by)],
        ['Started (UTC)', instant(action.created_at)],
        ['Updated (UTC)', instant(action.updated_at)],
        ['Finished (UTC)', instant(action.finished_at)],
        ['Error', action.error],
      ]))),
    );
    return action.state === 'running';
  };
  let running = await draw();
  ctx.every(POLL_MS, async () => {
    if (running) running = await draw();
  });
}

export default {
  name: 'bulk',
  title: 'Bulk actions',
  render(container, ctx) {
    return ctx.segments.length >= 1 ? renderDetail(container, ctx) : renderList(container, ctx);
  },
};
