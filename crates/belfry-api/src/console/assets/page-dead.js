// Dead letters: a tenant's failed (or missed) events, redriven or deleted
// one by one or all at once as a bulk action.

import { api, query, tenantPath } from './api.js';
import { busy, button, confirmButton, h, number, pageHead, panel, table } from './dom.js';
import { EVENT_COLUMNS, PAGE_SIZE, deleteEvent, filterForm, listQuery, pager, redrive } from './page-events.js';

/** Counting stops after this many pages of the largest size. */
const COUNT_PAGES = 10;
const COUNT_PAGE_SIZE = 1000;

/** How many events match (`more`: at least that many). */
async function count(tenant, params) {
  let counted = 0;
  let cursor = null;
  for (let page = 0; page < COUNT_PAGES; page += 1) {
    const answer = await api(tenantPath(tenant, `/events${query({
      status: params.get('status'), from: params.get('from'), to: params.get('to'), cursor, limit: COUNT_PAGE_SIZE,
    })}`));
    counted += answer.events.length;
    if (!answer.next_cursor) return { counted, more: false };
    cursor = answer.next_cursor;
  }
  return { counted, more: true };
}

export default {
  name: 'dead',
  title: 'Dead letters',
  async render(container, ctx) {
    const tenant = await ctx.tenant();
    container.append(pageHead('Dead letters',
      'Events whose delivery failed for good (a 4xx, or retries ran out) or that were missed while the node was down.'));
    if (!tenant) {
      container.append(panel(null, h('p', { class: 'muted' }, 'No tenant is registered yet.')));
      return;
    }
    const params = new URLSearchParams(ctx.params);
    params.set('tenant', tenant);
    if (!params.get('status')) params.set('status', 'failed');
    const status = params.get('status');
    const form = await filterForm({ ...ctx, params }, 'dead', tenant, { statuses: ['failed', 'missed'], anyStatus: false });
    const [answer, matching] = await Promise.all([
      api(tenantPath(tenant, `/events${listQuery(params, PAGE_SIZE)}`)),
      count(tenant, params),
    ]);
    const total = `${number(matching.counted)}${matching.more ? '+' : ''}`;
    const reload = () => ctx.go('dead', [], Object.fromEntries(params));
    const columns = [...EVENT_COLUMNS];
    if (ctx.canWrite) {
      columns.push({
        label: '',
        cell: (event) => {
          const again = button('Redrive', () => busy(again, () => redrive(tenant, event.id), reload),
            { write: true, title: 'Send it again now, as a new version' });
          const remove = confirmButton('Delete', 'Really delete?',
            (element) => busy(element, () => deleteEvent(tenant, event.id), reload),
            { write: true, title: 'Delete it and its attempt history' });
          return h('div', { class: 'actions' }, [again, remove]);
        },
      });
    }
    // One bulk action over every event matching this filter; its page follows it.
    const bulk = (element, action) => busy(element, () => api('/v1/bulk-actions', {
      method: 'POST',
      body: {
        action,
        filter: { tenant, status, from: params.get('from') || undefined, to: params.get('to') || undefined },
      },
    }), (created) => ctx.go('bulk', [created.id]));
    const actions = [];
    if (ctx.canWrite && matching.counted > 0) {
      const all = button(`Redrive all ${total} ${status}`, () => bulk(all, 'redrive'), {
        kind: 'primary', write: true, title: 'One bulk action that redrives every event matching this filter',
      });
      const deleteAll = confirmButton(`Delete all ${total} ${status}`, `Really delete all ${total}?`,
        (element) => bulk(element, 'delete'), {
          write: true, title: 'One bulk action that deletes every event matching this filter, with its history',
        });
      actions.push(all, deleteAll);
    }
    container.append(
      panel(null, form),
      panel(null,
        h('div', { class: 'page-head' },
          h('p', { class: 'dead-count' }, `${total} ${status} event${matching.counted === 1 ? '' : 's'} match`),
          h('div', { class: 'actions' }, actions)),
        table(columns, answer.events, { empty: `No ${status} event: nothing to redrive or delete.`, rowAttrs: (e) => ({ dataset: { event: e.id } }) }),
        pager('dead', [], params, answer.next_cursor)),
    );
  },
};
