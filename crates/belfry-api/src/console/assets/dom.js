// Building the page: elements, tables, badges and formatting. Data only
// ever becomes text nodes or attribute values (never HTML), so nothing a
// tenant stored can run in the console.

import { query } from './api.js';

/**
 * An element: `h('a', {href: '#/x', class: 'y', on: {click: f}}, 'text', child)`.
 * Children may be strings, numbers, nodes, arrays, or null/false (skipped).
 */
export function h(tag, attrs = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs ?? {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === 'on') {
      for (const [event, handler] of Object.entries(value)) element.addEventListener(event, handler);
    } else if (name === 'dataset') {
      Object.assign(element.dataset, value);
    } else if (name === 'class') {
      element.className = value;
    } else if (value === true) {
      element.setAttribute(name, '');
    } else {
      element.setAttribute(name, String(value));
    }
  }
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(element, child);
    else if (child instanceof Node) element.append(child);
    else element.append(document.createTextNode(String(child)));
  }
}

/**
 * The hash of a console page: `hashLink('events', [tenant, id], {status})`
 * → `#/events/t%2F1/e1?status=failed` (each segment encoded; empty
 * parameters left out).
 */
export function hashLink(page, segments = [], params = {}) {
  return `#/${[page, ...segments].map(encodeURIComponent).join('/')}${query(params)}`;
}

/**
 * A table: `columns` are `{label, cell: row => child, class?}`; `rows` any
 * values. `empty` is shown when there are none.
 */
export function table(columns, rows, { empty = 'Nothing here.', rowAttrs } = {}) {
  const head = h('thead', {}, h('tr', {}, columns.map((c) => h('th', { class: c.class }, c.label))));
  const body = h('tbody');
  if (rows.length === 0) {
    body.append(h('tr', {}, h('td', { class: 'empty', colspan: columns.length }, empty)));
  }
  for (const row of rows) {
    body.append(h('tr', rowAttrs ? rowAttrs(row) : {}, columns.map((c) => h('td', { class: c.class }, c.cell(row)))));
  }
  return h('table', {}, head, body);
}

/** A panel with an optional heading. */
export function panel(title, ...children) {
  return h('section', { class: 'panel' }, title ? h('h2', {}, title) : null, children);
}

/** The page's heading, a subtitle and actions on the right. */
export function pageHead(title, subtitle, ...actions) {
  return h('div', { class: 'page-head' },
    h('div', {}, h('h1', {}, title), subtitle ? h('p', { class: 'muted' }, subtitle) : null),
    actions.length ? h('div', { class: 'actions' }, actions) : null);
}

/** A status word as a coloured badge (the CSS knows the statuses). */
export function badge(status) {
  return h('span', { class: `badge ${status ?? ''}` }, status ?? '-');
}

/** `<dl>` of `[label, value]` pairs; null values read `-`. */
export function fields(pairs) {
  return h('dl', { class: 'fields' }, pairs.map(([label, value]) => [
    h('dt', {}, label),
    h('dd', {}, value === null || value === undefined || value === '' ? '-' : value),
  ]));
}

/** A form field with its label above. */
export function field(label, control) {
  return h('label', { class: 'field' }, label, control);
}

/** `<select>` of `[value, label]` options. */
export function select(name, options, current) {
  return h('select', { name }, options.map(([value, label]) =>
    h('option', { value, selected: value === (current ?? '') }, label)));
}

/** A button; `write: true` marks it as one only writers get (tests check). */
export function button(label, onClick, { kind, write = false, title } = {}) {
  return h('button', {
    type: 'button', class: kind, title, dataset: write ? { write: '' } : undefined,
    on: { click: onClick },
  }, label);
}

/**
 * A button for something that cannot be undone: the first click asks
 * (`Cancel?`), a second one within a few seconds does it. No modal
 * dialog: it would block the page (and scripts driving it).
 */
export function confirmButton(label, question, onConfirm, options = {}) {
  let armed = null;
  const element = button(label, () => {
    if (armed) {
      clearTimeout(armed);
      armed = null;
      element.textContent = label;
      onConfirm(element);
      return;
    }
    element.textContent = question;
    armed = setTimeout(() => {
      armed = null;
      element.textContent = label;
    }, 4000);
  }, { kind: 'danger', ...options });
  return element;
}

/**
 * Runs `action` for a button: disabled while it runs, errors to the
 * banner, then `done` with the result.
 */
export async function busy(buttonElement, action, done) {
  buttonElement.disabled = true;
  try {
    const result = await action();
    banner(null);
    if (done) await done(result);
  } catch (error) {
    banner(error);
  } finally {
    buttonElement.disabled = false;
  }
}

/** Shows an error (or a message with kind 'info') above the page; null hides it. */
export function banner(message, kind = 'error') {
  const element = document.getElementById('banner');
  if (!message) {
    element.hidden = true;
    element.textContent = '';
    return;
  }
  const text = message instanceof Error
    ? `${message.code ? `${message.code}: ` : ''}${message.message}`
    : String(message);
  element.className = kind === 'info' ? 'info' : '';
  element.textContent = text;
  element.hidden = false;
}

export function number(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return '-';
  return Number(value).toLocaleString('en-US', { maximumFractionDigits: 2 });
}

/** An RFC 3339 instant as `2030-01-31 04:00:30.250Z` (UTC, as the API). */
export function instant(text) {
  if (!text) return '-';
  return text.replace('T', ' ');
}

/**
 * A local time as the API writes it (`2027-03-28T03:00:00+02:00[Europe/Berlin]`)
 * as `2027-03-28 03:00:00 +02:00`.
 */
export function localTime(text) {
  if (!text) return '-';
  const [time] = text.split('[');
  const match = /^(.*?)(Z|[+-]\d\d:\d\d)$/.exec(time);
  return match ? `${match[1].replace('T', ' ')} ${match[2]}` : time.replace('T', ' ');
}

/** An instant with how far from now it is: `… (in 5 s)`. */
export function instantWithAge(text) {
  if (!text) return '-';
  return h('span', { title: text }, instant(text), h('span', { class: 'muted small' }, ` (${relative(text)})`));
}

/** `in 5 s`, `3 min ago`. */
export function relative(text) {
  const ms = Date.parse(text) - Date.now();
  if (Number.isNaN(ms)) return '';
  const words = duration(Math.abs(ms));
  return ms >= 0 ? `in ${words}` : `${words} ago`;
}

/** Milliseconds as `850 ms`, `12 s`, `4 min`, `3 h`, `2 d`. */
export function duration(ms) {
  if (ms === null || ms === undefined) return '-';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 120) return `${Math.round(s * 10) / 10} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86400)} d`;
}

/** A `datetime-local` value (the browser's zone) as RFC 3339 UTC, or ''. */
export function localInputToRfc3339(value) {
  if (!value) return '';
  const at = new Date(value);
  return Number.isNaN(at.getTime()) ? '' : at.toISOString();
}

/** RFC 3339 as a `datetime-local` value in the browser's zone, or ''. */
export function rfc3339ToLocalInput(text) {
  if (!text) return '';
  const at = new Date(text);
  if (Number.isNaN(at.getTime())) return '';
  const local = new Date(at.getTime() - at.getTimezoneOffset() * 60000);
  return local.toISOString().slice(0, 19);
}
