// Two or more probes on one chart (e.g. two models, or two datasets): one line
// per probe and pooling; probes differ by dash pattern, poolings by marker.
import { api } from "./api.js";
import { h, page, section, fmt, sortableTable, main } from "./ui.js";
import { lineChart, legend, COLORS, DASHES, MARKERS } from "./charts.js";
import { probeSeries } from "./probe.js";

function chooser(probes, chosen) {
  const done = probes.filter((p) => p.state === "succeeded");
  const form = h("form", { class: "card", id: "compare-form" }, h("fieldset", {}, h("legend", {}, "Probes to compare"),
    done.length ? done.map((p) => h("label", { class: "check" }, h("input", { type: "checkbox", name: "probe", value: p.id,
      checked: chosen.includes(p.id) }), ` ${p.id} (dataset ${p.request.dataset_id}, best ${fmt.num(p.result.best.accuracy)})`))
      : h("p", { class: "muted" }, "No probe has succeeded yet.")),
  h("button", { type: "submit" }, "Compare"));
  form.onsubmit = (e) => {
    e.preventDefault();
    const ids = new FormData(form).getAll("probe");
    location.assign(`/lab/compare?probes=${ids.map(encodeURIComponent).join(",")}`);
  };
  return form;
}

export async function comparePage(params) {
  const chosen = (params.get("probes") || "").split(",").map((s) => s.trim()).filter(Boolean);
  const [all, datasets, ...picked] = await Promise.all([api("/v1/probes?limit=200"), api("/v1/datasets"),
    ...chosen.map((id) => api(`/v1/probes/${encodeURIComponent(id)}`))]);
  const names = Object.fromEntries(datasets.data.map((d) => [d.id, d.name]));
  const ready = picked.filter((p) => p.state === "succeeded");
  const series = [];
  ready.forEach((p, i) => {
    const label = `${p.id.slice(0, 8)} (${names[p.request.dataset_id] || p.request.dataset_id}, ${p.result.model.name || ""}) `;
    probeSeries(p.result, "accuracy", { prefix: `${p.id}:`, labelPrefix: label }).series.forEach((sr, j) => {
      // only the layers: combined views may differ between probes
      series.push({ ...sr, short: `${p.id.slice(0, 8)} ${sr.id.split(":")[1]}`,
        points: sr.points.filter((q) => q.connect), color: COLORS[i % COLORS.length],
        dash: DASHES[i % DASHES.length], marker: MARKERS[j % MARKERS.length] });
    });
  });
  const L = Math.max(0, ...ready.map((p) => p.result.task.n_hidden_states));
  page("Compare probes", chooser(all.data, chosen),
    picked.filter((p) => p.state !== "succeeded").map((p) => h("p", { class: "muted" }, `Probe ${p.id} is ${p.state}; it joins the chart once it has succeeded.`)),
    ready.length ? [section("Accuracy by hidden state", h("figure", { id: "compare-chart" },
      lineChart({ title: "accuracy by hidden state, one line per probe and pooling", xLabel: "hidden state", yLabel: "accuracy (held-out folds)",
        series, xTicks: [...Array(L).keys()].map((k) => ({ x: k, label: `h${k}` })) }), legend(series))),
    section("Best of each", sortableTable("Best view per probe", [
      { key: "id", label: "probe", value: (p) => p.id, cell: (p) => h("a", { href: `/lab/probes/${p.id}` }, p.id) },
      { key: "ds", label: "dataset", value: (p) => names[p.request.dataset_id] || p.request.dataset_id },
      { key: "model", label: "model", value: (p) => p.result.model.name || "–" },
      { key: "n", label: "examples", value: (p) => p.result.task.n_examples, numeric: true },
      { key: "best", label: "best view", value: (p) => `${p.result.best.view}, ${p.result.best.pooling}` },
      { key: "acc", label: "accuracy", value: (p) => p.result.best.accuracy, cell: (p) => `${fmt.num(p.result.best.accuracy)} ± ${fmt.num(p.result.best.accuracy_std)}`, numeric: true },
      { key: "chance", label: "chance", value: (p) => p.result.task.chance_accuracy, cell: (p) => fmt.num(p.result.task.chance_accuracy), numeric: true },
    ], ready, { sortBy: "acc", rowAttrs: (p) => ({ "data-probe": p.id }) }))] : h("p", {}, "Choose one or more probes above."));
  main().setAttribute("data-ready", "true");
}
