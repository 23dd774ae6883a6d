// The API client. The token lives in this module's variable only: never in a URL, a cookie
// or web storage (any script of the origin could read those, and session restore writes them
// to disk). Its price is typing it again after a reload.

let token = null;

/** Called when the API answers 401: the console shows its login. */
let onUnauthorized = () => {};

export function setToken(t) {
  token = t || null;
}

export function hasToken() {
  return token !== null;
}

export function whenUnauthorized(fn) {
  onUnauthorized = fn;
}

/** An error with the API's own sentence (or ours when it did not answer). */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** A GET gives up after this long: a hung server must turn the indicator stale, not freeze it. */
const GET_TIMEOUT_MS = 4000;

function headers(json) {
  const h = { Accept: "application/json" };
  if (json) h["Content-Type"] = "application/json";
  if (token) h.Authorization = `Bearer ${token}`;
  return h;
}

async function answer(response) {
  if (response.status === 204) return null;
  const text = await response.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!response.ok) {
    const e = body && body.error;
    if (response.status === 401) onUnauthorized();
    throw new ApiError(response.status, e ? e.code : "http_error",
      e ? e.message : `sliver answered HTTP ${response.status}`);
  }
  return body;
}

/** GET `path` (JSON), aborted after GET_TIMEOUT_MS or when `signal` aborts. */
export async function get(path, signal) {
  const timeout = new AbortController();
  const timer = setTimeout(() => timeout.abort(), GET_TIMEOUT_MS);
  const abort = () => timeout.abort();
  if (signal) signal.addEventListener("abort", abort, { once: true });
  try {
    const response = await fetch(path, {
      headers: headers(false),
      signal: timeout.signal,
      cache: "no-store",
      credentials: "omit",
    });
    return await answer(response);
  } catch (e) {
    if (e instanceof ApiError) throw e;
    throw new ApiError(0, "no_answer", "no answer from sliver");
  } finally {
    clearTimeout(timer);
    if (signal) signal.removeEventListener("abort", abort);
  }
}

/** GET a text document (the OpenAPI description, /metrics) with the token. */
export async function getText(path) {
  const response = await fetch(path, { headers: headers(false), cache: "no-store", credentials: "omit" });
  if (!response.ok) await answer(response);
  return response.text();
}

/**
 * POST / PATCH / DELETE. A network failure may leave the change made or not: the message
 * says so instead of guessing.
 */
export async function send(method, path, body) {
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: headers(body !== undefined),
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
    });
  } catch {
    throw new ApiError(0, "no_answer",
      "no answer from sliver: the list shows whether the change was made");
  }
  return answer(response);
}

export const enc = encodeURIComponent;
