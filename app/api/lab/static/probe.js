// One probe: live progress, then the per-layer chart (±std bands, one line per
// pooling, control task and chance, best view marked), the sortable table with
// "save as head" on every row, the scalar-mix weights, the learning curve and the advice.
import { api, streamEvents } from "./api.js";
import { h, page, section, fmt, dl, progressBar, sortableTable, showError, main } from "./ui.js";
import { lineChart, legend, bars, COLORS } from "./charts.js";

const SHORT = { concat_last_4: "concat4", sum_last_4: "sum4", mean_all: "mean all", scalar_mix: "mix" };
const METRICS = { accuracy: "accuracy", macro_f1: "macro-F1" };

// Chart series from a probe result: x = hidden state for one-layer views, then the
// combined views to the right of the layers (drawn as points with whiskers).
export function probeSeries(result, metric, { prefix = "", labelPrefix = "" } = {}) {
  const L = result.task.n_hidden_states;
  const combined = [...new Set(result.results.filter((r) => r.layer === null).map((r) => r.view))];
  const xOf = (r) => (r.layer !== null ? r.layer : L + 0.5 + combined.indexOf(r.view));
  const poolings = [...new Set(result.results.map((r) => r.pooling))];
  const series = poolings.map((pool) => ({
    id: prefix + pool, label: `${labelPrefix}${pool} pooling`,
    points: result.results.filter((r) => r.pooling === pool).map((r) => ({
      x: xOf(r), y: r[metric].mean, std: r[metric].std, name: r.view, connect: r.layer !== null,
      attrs: { "data-layer": r.layer, "data-view": r.view, "data-pooling": r.pooling } })).sort((a, b) => a.x - b.x),
  }));
  const xTicks = [...Array(L).keys()].map((k) => ({ x: k, label: `h${k}` }))
    .concat(combined.map((v, j) => ({ x: L + 0.5 + j, label: SHORT[v] || v })));
  return { series, xTicks, xOf };
}

function controlRows(result) {
  const ct = result.control_task;
  return ct ? Object.fromEntries(ct.results.map((c) => [`${c.view}|${ct.pooling}`, c])) : {};
}

async function saveHead(id, row, where) {
  try {
    const head = await api("/v1/heads", { method: "POST", json: { probe: id, view: row.view, pooling: row.pooling } });
    location.assign(`/lab/heads/${encodeURIComponent(head.id)}`);
  } catch (err) { showError(where, err); }
}

function chartBlock(result, metric) {
  const { series, xTicks, xOf } = probeSeries(result, metric);
  const hlines = [];
  if (metric === "accuracy") {
    hlines.push({ y: result.task.chance_accuracy, label: "chance" });
    const ct = result.control_task;
    if (ct) {
      series.push({ id: "control", label: `control task (${ct.pooling})`, color: "#777", dash: "2 3", marker: "diamond",
        points: ct.results.filter((c) => c.layer !== null && c.layer !== undefined).map((c) => ({
          x: c.layer, y: c.control_accuracy, std: c.control_accuracy_std, name: c.view,
          attrs: { "data-layer": c.layer, "data-view": c.view } })).sort((a, b) => a.x - b.x) });
    }
  }
  const best = result.best;
  const bestRow = result.results.find((r) => r.view === best.view && r.pooling === best.pooling);
  const svg = lineChart({ title: `${METRICS[metric]} by hidden state and pooling (mean ± std over folds)`,
    xLabel: "hidden state (h0 = embeddings) and combined views", yLabel: `${METRICS[metric]} (held-out folds)`,
    series, xTicks, hlines, mark: { series: best.pooling, x: xOf(bestRow), label: `best: ${best.view}, ${best.pooling}` } });
  return h("figure", { id: "probe-chart", "data-metric": metric }, svg, legend(series),
    h("figcaption", {}, `Bands and whiskers: ± one standard deviation over ${result.task.cv} folds. `,
      `Best view (ringed): ${best.view} with ${best.pooling} pooling, accuracy ${fmt.num(best.accuracy)} ± ${fmt.num(best.accuracy_std)}.`,
      metric === "accuracy" ? ` Chance (always the most frequent class): ${fmt.num(result.task.chance_accuracy)}.` : ""));
}

function resultView(id, p) {
  const result = p.result;
  const ctl = controlRows(result);
  const best = result.best;
  let metric = "accuracy";
  const chartBox = h("div", {}, chartBlock(result, metric));
  const picker = h("fieldset", { class: "inline" }, h("legend", {}, "Score"),
    Object.entries(METRICS).map(([k, label]) => h("label", { class: "check" },
      h("input", { type: "radio", name: "metric", value: k, checked: k === metric,
        onchange: () => { metric = k; chartBox.replaceChildren(chartBlock(result, metric)); } }), ` ${label}`)));
  const tableBox = h("div", { id: "probe-table" });
  tableBox.append(sortableTable("Every view and pooling (click a header to sort)", [
    { key: "view", label: "view", value: (r) => r.view },
    { key: "pooling", label: "pooling", value: (r) => r.pooling },
    { key: "acc", label: "accuracy", value: (r) => r.accuracy.mean, cell: (r) => `${fmt.num(r.accuracy.mean)} ± ${fmt.num(r.accuracy.std)}`, numeric: true },
    { key: "f1", label: "macro-F1", value: (r) => r.macro_f1.mean, cell: (r) => fmt.num(r.macro_f1.mean), numeric: true },
    { key: "control", label: "control", value: (r) => (ctl[`${r.view}|${r.pooling}`] || {}).control_accuracy ?? null,
      cell: (r) => fmt.num((ctl[`${r.view}|${r.pooling}`] || {}).control_accuracy), numeric: true },
    { key: "sel", label: "selectivity", value: (r) => (ctl[`${r.view}|${r.pooling}`] || {}).selectivity ?? null,
      cell: (r) => fmt.num((ctl[`${r.view}|${r.pooling}`] || {}).selectivity), numeric: true },
    { key: "fit", label: "fit s/fold", value: (r) => r.fit_seconds.mean, cell: (r) => fmt.num(r.fit_seconds.mean), numeric: true },
    { key: "gap", label: "gap to best", value: (r) => r.gap_to_best, cell: (r) => fmt.num(r.gap_to_best), numeric: true },
    { key: "head", label: "head", cell: (r) => h("button", { type: "button", class: "small",
      "aria-label": `save ${r.view} ${r.pooling} as a head`, onclick: () => saveHead(id, r, tableBox) }, "save as head") },
  ], result.results, { sortBy: "acc", desc: true,
    rowAttrs: (r) => ({ "data-view": r.view, "data-pooling": r.pooling,
      class: r.view === best.view && r.pooling === best.pooling ? "best" : null }) }));
  const mix = result.scalar_mix ? Object.entries(result.scalar_mix).filter(([, v]) => v) : [];
  const lc = result.learning_curve;
  const rec = result.recommendation;
  return h("div", { id: "result" },
    section("Which layer, which pooling", picker, chartBox,
      h("p", {}, h("button", { type: "button", id: "save-best", onclick: (e) => saveHead(id, best, e.target.parentNode) },
        `Save the best (${best.view}, ${best.pooling}) as a head`))),
    section("All results", tableBox),
    mix.length ? section("Learned scalar mix", mix.map(([pool, m]) => h("figure", { class: "mix", "data-pooling": pool },
      bars(m.layer_weights.map((w, i) => ({ label: `h${i}`, value: w, text: w.toFixed(3) })), { title: `layer weights, ${pool} pooling` }),
      h("figcaption", {}, `${pool} pooling: accuracy ${fmt.num(m.accuracy.mean)} ± ${fmt.num(m.accuracy.std)}; weights sum to 1 (uniform would be ${(1 / m.layer_weights.length).toFixed(3)} each).`)))) : null,
    lc ? section("Learning curve", h("figure", { id: "learning-curve" },
      lineChart({ title: `accuracy against training examples (${lc.view}, ${lc.pooling})`, xLabel: "training examples per fold",
        yLabel: "accuracy", series: [{ id: "lc", label: `${lc.view}, ${lc.pooling}`, color: COLORS[0],
          points: lc.points.map((q) => ({ x: q.train_size, y: q.accuracy.mean, std: q.accuracy.std, name: q.label })) }],
        xTicks: lc.points.map((q) => ({ x: q.train_size, label: q.label === "all" ? `${q.train_size} (all)` : String(q.train_size) })) }),
      h("figcaption", {}, lc.points.map((q) => `${q.label}: ${fmt.num(q.accuracy.mean)} ± ${fmt.num(q.accuracy.std)}`).join(" · ")))) : null,
    rec ? section("Advice", h("p", { id: "advice" }, rec.text),
      h("details", {}, h("summary", {}, "The numbers behind it"), dl(Object.entries(rec.numbers || {}).map(([k, v]) =>
        [k, /bytes/.test(k) ? `${fmt.bytes(v)} (${fmt.int(v)} B)` : typeof v === "number" ? (Number.isInteger(v) ? fmt.int(v) : fmt.num(v)) : String(v)])))) : null,
    (result.warnings || []).length ? section("Warnings", h("ul", {}, result.warnings.map((w) => h("li", {}, w)))) : null);
}

export async function probePage(id) {
  let p = await api(`/v1/probes/${encodeURIComponent(id)}`);
  const prog = h("div", { id: "progress", "aria-live": "polite" }, progressBar(p));
  const after = h("div", {});
  const req = p.request || {};
  page(`Probe ${id}`,
    dl([["dataset", h("a", { href: `/lab/datasets/${req.dataset_id}` }, req.dataset_id || "–")],
      ["views", (req.views || []).join(", ")], ["poolings", (req.poolings || []).join(", ")], ["head", req.head],
      ["folds", req.cv], ["created", fmt.time(p.created)],
      ["compare", h("a", { href: `/lab/compare?probes=${encodeURIComponent(id)}` }, "with other probes")]]),
    section("Progress", prog), after);
  if (["queued", "running"].includes(p.state)) {
    await streamEvents(`/v1/jobs/${encodeURIComponent(id)}/events`, (_n, j) => prog.replaceChildren(progressBar(j)));
    p = await api(`/v1/probes/${encodeURIComponent(id)}`);
    prog.replaceChildren(progressBar(p));
  }
  if (p.state !== "succeeded") {
    after.append(h("p", {}, `This probe ${p.state}${p.error ? `: ${p.error}` : ""}.`));
    main().setAttribute("data-ready", "true");  // finished, with nothing more to draw
    return;
  }
  after.append(resultView(id, p));
  main().setAttribute("data-ready", "true");
}
