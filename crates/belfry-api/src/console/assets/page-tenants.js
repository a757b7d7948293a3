// Tenants: every tenant the key sees (all for admins), with its sink and
// links to its events, schedules and dead letters.

import { api } from './api.js';
import { h, hashLink, pageHead, panel, table } from './dom.js';

/** Where a tenant's events go, in one line (write-only parts are masked by the API). */
function target(sink) {
  switch (sink.type) {
    case 'http': return sink.url;
    case 'kafka': return `topic ${sink.topic}`;
    case 'builtin': return `processor ${sink.processor}`;
    default: return '';
  }
}

export default {
  name: 'tenants',
  title: 'Tenants',
  async render(container, ctx) {
    const { tenants } = await api('/v1/tenants');
    const columns = [
      { label: 'Tenant', cell: (t) => h('a', { href: hashLink('events', [], { tenant: t.name }) }, t.name) },
      { label: 'Channel', cell: (t) => t.sink.type },
      { label: 'Delivers to', cell: (t) => h('span', { class: 'mono' }, target(t.sink)) },
      {
        label: '',
        cell: (t) => h('span', { class: 'actions' },
          h('a', { href: hashLink('events', [], { tenant: t.name }) }, 'Events'),
          h('a', { href: hashLink('schedules', [], { tenant: t.name }) }, 'Schedules'),
          h('a', { href: hashLink('dead', [], { tenant: t.name }) }, 'Dead letters')),
      },
    ];
    container.append(
      pageHead('Tenants', ctx.isAdmin ? `${tenants.length} registered` : 'Your key\'s tenant'),
      panel(null, table(columns, tenants, { empty: 'No tenant is registered.' })),
    );
  },
};
