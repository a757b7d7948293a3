// The console's shell: who is signed in, the navigation, and a hash
// router (`#/page/segment/segment?name=value`) that renders one page
// module at a time into <main>.
//
// Each page module exports `{name, title, admin, render(container, ctx)}`;
// `render` fills `container` (awaiting its data) and may register polls
// with `ctx.every`, which stop when the user navigates away. When a
// render finished, <main> carries `data-ready="<page name>"`.

import { api, forgetKey, onUnauthorized, storeKey } from './api.js';
import { banner, button, h, hashLink, select } from './dom.js';
import overview from './page-overview.js';
import tenants from './page-tenants.js';
import events from './page-events.js';
import schedules from './page-schedules.js';
import dead from './page-dead.js';
import bulk from './page-bulk.js';
import cluster from './page-cluster.js';
import audit from './page-audit.js';

const PAGES = [overview, tenants, events, schedules, dead, bulk, cluster, audit];

/** The answer of `GET /v1/whoami` (role null: not signed in). */
let who = { key_id: null, role: null, tenant: null, can_write: false, open: false };
/** Why the last sign-in ended, shown on the sign-in page. */
let signInMessage = null;
/** Stops the current page's polls. */
let stopCurrent = () => {};
/** Incremented per render, so a slow render of a left page changes nothing. */
let generation = 0;
/** The tenants this key sees, fetched once per sign-in. */
let tenantNames = null;

const main = document.getElementById('main');

function isAdmin() {
  return who.role === 'admin';
}

function defaultPage() {
  return isAdmin() ? 'overview' : 'events';
}

/** `#/a/b%2Fc?x=1` → `{name: 'a', segments: ['b/c'], params}`. */
function parseHash() {
  const text = location.hash.replace(/^#/, '');
  const [path, search = ''] = text.split('?');
  const parts = path.split('/').filter(Boolean).map((part) => {
    try {
      return decodeURIComponent(part);
    } catch {
      return part;
    }
  });
  return { name: parts[0] ?? '', segments: parts.slice(1), params: new URLSearchParams(search) };
}

function renderWho() {
  const element = document.getElementById('who');
  element.replaceChildren();
  if (!who.role) return;
  if (who.open) {
    element.append(h('span', { class: 'role', title: 'No API key exists: the node is open to this machine' }, 'open mode'));
    return;
  }
  element.append(
    h('span', { class: 'mono' }, who.key_id ?? ''),
    h('span', { class: 'role' }, who.role),
    ...(who.tenant ? [h('span', {}, `tenant ${who.tenant}`)] : []),
    button('Sign out', signOut, { title: 'Forget the key in this tab' }),
  );
}

function renderNav(current) {
  const nav = document.getElementById('nav');
  nav.replaceChildren();
  if (!who.role) return;
  for (const page of PAGES) {
    if (page.admin && !isAdmin()) continue;
    nav.append(h('a', { href: hashLink(page.name), class: page.name === current ? 'current' : null }, page.title));
  }
}

function signOut() {
  forgetKey();
  who = { key_id: null, role: null, tenant: null, can_write: false, open: false };
  tenantNames = null;
  signInMessage = null;
  location.hash = '#/';
  route();
}

function renderSignIn(container) {
  const input = h('input', {
    type: 'password', name: 'key', placeholder: 'bfy_…', autocomplete: 'off', spellcheck: 'false', required: true,
  });
  const error = h('p', { class: 'error', role: 'alert' }, signInMessage ?? '');
  const submit = h('button', { type: 'submit', class: 'primary' }, 'Sign in');
  const form = h('form', {
    on: {
      submit: async (event) => {
        event.preventDefault();
        const key = input.value.trim();
        if (!key) return;
        submit.disabled = true;
        try {
          const answer = await api('/v1/whoami', { key });
          if (!answer.role) throw new Error('the node did not accept this key');
          storeKey(key);
          who = answer;
          signInMessage = null;
          tenantNames = null;
          route();
        } catch (e) {
          error.textContent = e.status === 401 ? `This key was refused: ${e.message}` : e.message;
          submit.disabled = false;
        }
      },
    },
  }, input, submit);
  container.append(h('section', { class: 'panel signin' },
    h('h1', {}, 'Sign in'),
    h('p', { class: 'muted' },
      'Enter an API key (bfy_…). It stays in this browser tab only and is sent with every request the console makes; ',
      'admin keys see every tenant and the cluster, tenant keys their own tenant, read keys cannot change anything.'),
    form, error));
  main.dataset.ready = 'signin';
  input.focus();
}

/** What a page gets besides its container. */
function context(name, segments, params, mine) {
  const timers = [];
  stopCurrent = () => timers.forEach((id) => clearInterval(id));
  return {
    who,
    segments,
    params,
    isAdmin: isAdmin(),
    canWrite: Boolean(who.can_write),
    alive: () => mine === generation,
    /** Navigates (renders the page anew). */
    go: (page, pageSegments = [], pageParams = {}) => {
      const target = hashLink(page, pageSegments, pageParams);
      if (target === location.hash) route();
      else location.hash = target;
    },
    /** Polls `fn` every `ms` while this page is shown; errors go to the banner. */
    every: (ms, fn) => {
      const id = setInterval(async () => {
        if (mine !== generation) return;
        try {
          await fn();
        } catch (error) {
          banner(error);
        }
      }, ms);
      timers.push(id);
    },
    tenants: loadTenants,
    /** The tenant the page is about: `?tenant=`, else the first one seen. */
    tenant: async () => params.get('tenant') || (await loadTenants())[0] || null,
    /** A tenant `<select>`; picking one calls `onChange(name)`. */
    tenantPicker: async (current, onChange) => {
      const names = [...await loadTenants()];
      if (current && !names.includes(current)) names.unshift(current);
      const control = select('tenant', names.map((t) => [t, t]), current);
      control.addEventListener('change', () => onChange(control.value));
      return control;
    },
  };
}

async function loadTenants() {
  if (!tenantNames) {
    const answer = await api('/v1/tenants');
    tenantNames = answer.tenants.map((t) => t.name);
    // A tenant key's events outlive its tenant's registration.
    if (who.tenant && !tenantNames.includes(who.tenant)) tenantNames.push(who.tenant);
  }
  return tenantNames;
}

async function route() {
  stopCurrent();
  stopCurrent = () => {};
  generation += 1;
  const mine = generation;
  banner(null);
  delete main.dataset.ready;
  const container = h('div');
  main.replaceChildren(container);
  renderWho();
  if (!who.role) {
    renderNav(null);
    renderSignIn(container);
    return;
  }
  let { name, segments, params } = parseHash();
  let page = PAGES.find((p) => p.name === name && (!p.admin || isAdmin()));
  if (!page) {
    name = defaultPage();
    page = PAGES.find((p) => p.name === name);
    segments = [];
    params = new URLSearchParams();
    history.replaceState(null, '', hashLink(name));
  }
  renderNav(name);
  try {
    await page.render(container, context(name, segments, params, mine));
    if (mine === generation) main.dataset.ready = name;
  } catch (error) {
    if (mine !== generation) return;
    banner(error);
    main.dataset.ready = name;
  }
}

onUnauthorized((message) => {
  forgetKey();
  who = { key_id: null, role: null, tenant: null, can_write: false, open: false };
  tenantNames = null;
  signInMessage = `Signed out: ${message}`;
  route();
});

async function boot() {
  window.addEventListener('hashchange', route);
  try {
    who = await api('/v1/whoami');
  } catch (error) {
    // A stored key that is refused now: onUnauthorized forgot it and
    // shows the sign-in page.
    if (error.status !== 401) banner(error);
    return;
  }
  await route();
}

boot();
