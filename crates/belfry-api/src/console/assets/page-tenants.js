// Tenants: every tenant the key sees (all for admins), with its sink, its
// notice target, its pause (and Pause / Resume for writers), its
// endpoint's circuit breaker, and links to its events, schedules and dead
// letters.

import { api, tenantPath } from './api.js';
import { busy, button, h, hashLink, instant, pageHead, panel, table } from './dom.js';

/** Where a tenant's events go, in one line (write-only parts are masked by the API). */
function target(sink) {
  switch (sink.type) {
    case 'http': return sink.url;
    case 'kafka': return `topic ${sink.topic}`;
    case 'builtin': return `processor ${sink.processor}`;
    default: return '';
  }
}

/** Where a tenant's notices go, if anywhere. */
function noticeTarget(tenant) {
  const notify = tenant.notify;
  if (!notify) return h('span', { class: 'muted' }, 'none');
  return h('span', { class: 'mono' }, notify.url || `topic ${notify.kafka_topic}`);
}

/** Its endpoint's circuit on the node answering; none for pull and built-in sinks. */
function circuit(tenant) {
  const c = tenant.circuit;
  if (!c) return h('span', { class: 'muted' }, '–');
  switch (c.state) {
    case 'open':
      return h('span', { title: 'due events wait; one probe delivery at the next probe time' },
        'open, next probe ', instant(c.next_probe_at));
    case 'half_open':
      return h('span', { title: 'one probe delivery is out' }, 'half-open since ', instant(c.since));
    default:
      return h('span', { class: 'muted' }, c.consecutive_failures > 0
        ? `closed (${c.consecutive_failures} failed in a row)` : 'closed');
  }
}

function paused(tenant) {
  return Boolean(tenant.pause && tenant.pause.paused);
}

/** Pause or Resume, whichever applies; `after` runs once it took effect. */
function pauseResume(ctx, tenant, after) {
  if (!ctx.canWrite) return null;
  const action = paused(tenant) ? 'resume' : 'pause';
  const element = button(paused(tenant) ? 'Resume' : 'Pause', () => busy(element,
    () => api(tenantPath(tenant.name, `/${action}`), { method: 'POST' }), after),
  { kind: paused(tenant) ? 'primary' : undefined, write: true });
  return element;
}

export default {
  name: 'tenants',
  title: 'Tenants',
  async render(container, ctx) {
    const draw = async () => {
      const { tenants } = await api('/v1/tenants');
      const columns = [
        { label: 'Tenant', cell: (t) => h('a', { href: hashLink('events', [], { tenant: t.name }) }, t.name) },
        { label: 'Channel', cell: (t) => t.sink.type },
        { label: 'Delivers to', cell: (t) => h('span', { class: 'mono' }, target(t.sink)) },
        { label: 'Notices to', cell: noticeTarget },
        {
          label: 'Deliveries',
          cell: (t) => (paused(t)
            ? h('span', { title: t.pause.reason || '' }, 'paused since ', instant(t.pause.since))
            : h('span', { class: 'muted' }, 'running')),
        },
        { label: 'Circuit', cell: circuit },
        {
          label: '',
          cell: (t) => h('span', { class: 'actions' },
            pauseResume(ctx, t, draw),
            h('a', { href: hashLink('events', [], { tenant: t.name }) }, 'Events'),
            h('a', { href: hashLink('schedules', [], { tenant: t.name }) }, 'Schedules'),
            h('a', { href: hashLink('dead', [], { tenant: t.name }) }, 'Dead letters')),
        },
      ];
      container.replaceChildren(
        pageHead('Tenants', ctx.isAdmin ? `${tenants.length} registered` : 'Your key\'s tenant'),
        panel(null, table(columns, tenants, { empty: 'No tenant is registered.' })),
      );
    };
    await draw();
  },
};
