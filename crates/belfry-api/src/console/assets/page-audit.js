// Audit log (admin): who created or revoked keys, changed tenants,
// redrove events. The API pages it oldest first; the console opens on the
// newest entries (it follows the pages to the end), or from the start.

import { api, query } from './api.js';
import { h, hashLink, instant, pageHead, panel, table } from './dom.js';

const PAGE = 100;
/** Following pages to the newest stops after this many. */
const MAX_WALK = 100;
const WALK_PAGE = 1000;

const COLUMNS = [
  { label: 'At (UTC)', cell: (e) => instant(e.at) },
  { label: 'Who (key)', cell: (e) => h('span', { class: 'mono' }, e.actor) },
  { label: 'Action', cell: (e) => e.action },
  { label: 'Tenant', cell: (e) => e.tenant ?? '-' },
  { label: 'Target', class: 'id', cell: (e) => e.target ?? '-' },
];

/** The newest `PAGE` entries, newest first. */
async function newest() {
  let after = null;
  let last = [];
  for (let walked = 0; walked < MAX_WALK; walked += 1) {
    const answer = await api(`/v1/audit${query({ after, limit: WALK_PAGE })}`);
    if (answer.entries.length) last = [...last, ...answer.entries].slice(-PAGE);
    if (!answer.next) return { entries: last.reverse(), complete: true };
    after = answer.next;
  }
  return { entries: last.reverse(), complete: false };
}

export default {
  name: 'audit',
  title: 'Audit log',
  admin: true,
  async render(container, ctx) {
    const fromStart = ctx.params.get('order') === 'oldest';
    if (fromStart) {
      const answer = await api(`/v1/audit${query({ after: ctx.params.get('after'), limit: PAGE })}`);
      container.append(
        pageHead('Audit log', 'Oldest first.', h('a', { href: hashLink('audit') }, 'Newest first')),
        panel(null, table(COLUMNS, answer.entries, { empty: 'The audit log is empty.' }),
          h('div', { class: 'pager' },
            ctx.params.get('after') ? h('a', { href: hashLink('audit', [], { order: 'oldest' }) }, '« First page') : null,
            answer.next ? h('a', { href: hashLink('audit', [], { order: 'oldest', after: answer.next }) }, 'Next page »') : null)),
      );
      return;
    }
    const { entries, complete } = await newest();
    container.append(
      pageHead('Audit log', `The newest ${PAGE} entries, newest first${complete ? '' : ' (of the first pages only: the log is long)'}.`,
        h('a', { href: hashLink('audit', [], { order: 'oldest' }) }, 'Oldest first')),
      panel(null, table(COLUMNS, entries, { empty: 'The audit log is empty.' })),
    );
  },
};
