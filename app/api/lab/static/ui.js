// Small DOM helpers shared by the pages: element builder, number formats,
// progress bars, sortable tables, error and key prompts.
import { ApiError, setApiKey, forgetApiKey, apiKey } from "./api.js";

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export const main = () => document.getElementById("main");

export function page(title, ...children) {
  document.title = `${title} · layerbank lab`;
  const m = main();
  m.replaceChildren(h("h1", {}, title), ...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
  return m;
}

export const fmt = {
  num: (v, d = 3) => (v === null || v === undefined || Number.isNaN(v) ? "–" : Number(v).toFixed(d)),
  int: (v) => (v === null || v === undefined ? "–" : Number(v).toLocaleString("en-US")),
  pct: (v, d = 1) => (v === null || v === undefined ? "–" : `${(100 * v).toFixed(d)}%`),
  bytes(v) {
    if (v === null || v === undefined) return "–";
    const units = ["B", "kB", "MB", "GB", "TB"];
    let i = 0, x = Number(v);
    while (x >= 1000 && i < units.length - 1) { x /= 1000; i++; }
    return `${x.toFixed(i ? 1 : 0)} ${units[i]}`;
  },
  secs(v) {
    if (v === null || v === undefined) return "–";
    return v < 90 ? `${v.toFixed(1)} s` : `${Math.floor(v / 60)} min ${Math.round(v % 60)} s`;
  },
  time: (t) => (t ? new Date(t * 1000).toLocaleString() : "–"),
};

export function section(title, ...children) {
  return h("section", {}, h("h2", {}, title), ...children);
}

// Errors in the API's own words ({"error", "type"}), announced to screen readers.
export function errorBox(err) {
  const msg = err instanceof ApiError ? `${err.message} (${err.type}, HTTP ${err.status})` : String(err.message || err);
  return h("p", { class: "error", role: "alert" }, msg);
}

export function showError(where, err) {
  const box = errorBox(err);
  where.querySelector(":scope > .error")?.remove();
  const title = where.querySelector(":scope > h1");
  if (title) title.after(box); else where.prepend(box);
  return box;
}

// The key prompt: shown when the server answers 401; the key lives in sessionStorage.
export function askKey(err) {
  const input = h("input", { id: "api-key", type: "password", autocomplete: "off", required: true });
  const form = h("form", { class: "card", "aria-labelledby": "key-title",
    onsubmit: (e) => { e.preventDefault(); setApiKey(input.value.trim()); location.reload(); } },
    h("h2", { id: "key-title" }, "This server needs an API key"),
    h("p", {}, apiKey() ? "The key given earlier was refused. " : "",
      "Enter the key the server was started with (--api-key). It is kept for this browser tab only ",
      "and sent as 'Authorization: Bearer …', exactly as the API expects."),
    h("label", { for: "api-key" }, "API key"), input,
    h("button", { type: "submit" }, "Use this key"));
  forgetApiKey();
  page("API key needed", form, err ? h("p", { class: "muted" }, err.message) : null);
  input.focus();
}

// Run a page; a 401 anywhere turns into the key prompt, any other error is shown in place.
export async function guard(fn) {
  try {
    await fn();
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) askKey(err);
    else {
      if (!(err instanceof ApiError)) console.error(err);  // a bug in the page, not an answer of the API
      showError(main(), err);
    }
  }
}

export function progressBar(job) {
  const p = (job && job.progress) || {};
  const total = p.total || 0, done = p.done || 0;
  const share = job && job.state === "succeeded" ? 1 : total ? done / total : 0;
  // done / total only when the job counted something (an extraction of cached texts has nothing to
  // encode: no "0 / ?" beside its 100%)
  const bits = total ? [`${fmt.int(done)} / ${fmt.int(total)}`] : done ? [`${fmt.int(done)} done`] : [];
  if (p.stage) bits.push(p.stage);
  if (p.tokens_per_second) bits.push(`${fmt.int(Math.round(p.tokens_per_second))} tokens/s`);
  if (p.eta_seconds !== undefined && p.eta_seconds !== null && job.state === "running") bits.push(`ETA ${fmt.secs(p.eta_seconds)}`);
  return h("div", { class: "progress" },
    h("progress", { max: 100, value: Math.round(share * 100), "aria-label": `${job ? job.kind || "job" : "job"} progress` }),
    h("span", { class: "progress-pct" }, `${Math.round(share * 100)}%`),
    h("span", { class: "state", "data-state": job ? job.state : "" }, job ? job.state : "–"),
    h("span", { class: "muted" }, bits.join(" · ")),
    job && job.error ? h("span", { class: "error" }, job.error) : null);
}

// A table sortable by any column: buttons in the header cells, aria-sort on the active one.
// columns: [{key, label, value(row) -> sortable, cell(row) -> node|string, numeric}]
export function sortableTable(caption, columns, rows, { sortBy = null, desc = true, rowAttrs } = {}) {
  let key = sortBy, down = desc;
  const table = h("table", { class: "data" });
  const render = (refocus = false) => {
    const col = columns.find((c) => c.key === key);
    const sorted = col ? [...rows].sort((a, b) => {
      const x = col.value(a), y = col.value(b);
      if (x === y) return 0;
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * (down ? -1 : 1);
    }) : rows;
    const head = h("tr", {}, columns.map((c) => {
      const th = h("th", { scope: "col", "aria-sort": c.key === key ? (down ? "descending" : "ascending") : null,
        class: c.numeric ? "num" : null });
      if (c.value) {
        th.append(h("button", { type: "button", class: "sort", "data-key": c.key,
          onclick: () => { if (key === c.key) down = !down; else { key = c.key; down = !!c.numeric; } render(true); } },
          c.label, h("span", { "aria-hidden": "true" }, c.key === key ? (down ? " ▼" : " ▲") : " ↕")));
      } else th.append(c.label);
      return th;
    }));
    table.replaceChildren(h("caption", {}, caption), h("thead", {}, head),
      h("tbody", {}, sorted.map((r) => h("tr", rowAttrs ? rowAttrs(r) : {},
        columns.map((c) => h("td", { class: c.numeric ? "num" : null }, c.cell ? c.cell(r) : String(c.value(r))))))));
    // the header was rebuilt: keep the keyboard where it was
    if (refocus) table.querySelector(`button.sort[data-key="${key}"]`).focus();
  };
  render();
  return h("div", { class: "table-wrap" }, table);
}

export function dl(pairs) {
  return h("dl", { class: "facts" }, pairs.filter(Boolean).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
