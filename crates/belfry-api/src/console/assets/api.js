// Calls to Belfry's JSON API with the console's key.
//
// The key lives in this tab's sessionStorage only: never in the URL (it
// would reach logs and the history), never in localStorage (it would
// outlive the tab). Every call sends it as `Authorization: Bearer`, and
// every write sends `Content-Type: application/json` (the API refuses
// other keyless writes from browsers).

const KEY_ITEM = 'belfry.console.key';

export function storedKey() {
  return sessionStorage.getItem(KEY_ITEM);
}

export function storeKey(key) {
  sessionStorage.setItem(KEY_ITEM, key);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY_ITEM);
}

/** An answer that is not 2xx, with the API's stable error code. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** Listeners told when a call answers 401 (the key was revoked or expired). */
const unauthorizedListeners = [];
export function onUnauthorized(listener) {
  unauthorizedListeners.push(listener);
}

/**
 * `method path` with an optional JSON body; resolves to the parsed JSON
 * (or the text with `{text: true}`), rejects with an ApiError.
 * `key: null` sends no key; the default is the stored one.
 */
export async function api(path, { method = 'GET', body, key = storedKey(), text = false } = {}) {
  const headers = { Accept: text ? 'text/plain' : 'application/json' };
  if (key) headers.Authorization = `Bearer ${key}`;
  const init = { method, headers, cache: 'no-store', credentials: 'omit', redirect: 'error' };
  if (method !== 'GET') {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body ?? {});
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch {
    throw new ApiError(0, 'unreachable', 'the node cannot be reached');
  }
  if (response.ok && text) return response.text();
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    const error = data?.error ?? { code: `http_${response.status}`, message: data?.message ?? response.statusText };
    if (response.status === 401 && key && key === storedKey()) unauthorizedListeners.forEach((listener) => listener(error.message));
    throw new ApiError(response.status, error.code, error.message);
  }
  return data;
}

/** One path segment: names may hold `/` (sent as `%2F`). */
export const seg = encodeURIComponent;

/** `/v1/tenants/{tenant}` plus `rest`. */
export function tenantPath(tenant, rest = '') {
  return `/v1/tenants/${seg(tenant)}${rest}`;
}

/** A query string from an object, leaving out empty values. */
export function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== '') search.set(name, value);
  }
  const text = search.toString();
  return text ? `?${text}` : '';
}
