// The lab's only way to the server: same-origin calls to the public /v1 API,
// with the API key (if the server has one) kept for this browser session.
const KEY = "layerbank.apiKey";

export class ApiError extends Error {
  constructor(status, body) {
    super(body && body.error ? body.error : `HTTP ${status}`);
    this.status = status;
    this.type = body && body.type ? body.type : "http";
    this.body = body;
  }
}

export function apiKey() { return sessionStorage.getItem(KEY) || ""; }
export function setApiKey(k) { sessionStorage.setItem(KEY, k); }
export function forgetApiKey() { sessionStorage.removeItem(KEY); }

function headers(extra) {
  const h = new Headers(extra || {});
  const k = apiKey();
  if (k) h.set("Authorization", `Bearer ${k}`);
  return h;
}

// Relative paths only: every request goes to the origin that served the page.
export async function api(path, { method = "GET", json, form, raw = false } = {}) {
  const init = { method, headers: headers(), credentials: "same-origin" };
  if (json !== undefined) {
    init.headers.set("Content-Type", "application/json");
    init.body = JSON.stringify(json);
  } else if (form !== undefined) {
    init.body = form;  // the browser sets the multipart boundary
  }
  const res = await fetch(path, init);
  if (!res.ok) {
    let body = null;
    try { body = await res.json(); } catch (_) { /* not JSON: keep the status */ }
    throw new ApiError(res.status, body);
  }
  if (raw) return res;
  return res.json();
}

// Server-sent events through fetch (EventSource cannot send the Authorization header).
export async function streamEvents(path, onEvent, signal) {
  const res = await fetch(path, { headers: headers({ Accept: "text/event-stream" }), signal });
  if (!res.ok) {
    let body = null;
    try { body = await res.json(); } catch (_) { /* keep the status */ }
    throw new ApiError(res.status, body);
  }
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      let name = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data += line.slice(5).trim();
      }
      if (data) onEvent(name, JSON.parse(data));
    }
  }
}

// A download that carries the key: fetch the bytes, then save them from a blob URL.
export async function download(path, filename) {
  const res = await api(path, { raw: true });
  const url = URL.createObjectURL(await res.blob());
  const a = document.createElement("a");
  a.href = url;
  a.download = filename;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// Prometheus text -> {name{labels}: value}, for the store figures on the home page.
export function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const i = line.lastIndexOf(" ");
    out[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return out;
}
