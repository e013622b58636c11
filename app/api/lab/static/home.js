// Home: the served model, the store, jobs with live progress, and every dataset,
// probe, head and regimes job, each a link to its own page.
import { api, parseMetrics } from "./api.js";
import { h, page, section, fmt, dl, progressBar, sortableTable, sleep } from "./ui.js";

const ACTIVE = ["queued", "running"];

function jobLink(j) {
  if (j.kind === "probe") return h("a", { href: `/lab/probes/${j.id}` }, j.id);
  if (j.kind === "regimes") return h("a", { href: `/lab/regimes/${j.id}` }, j.id);
  return j.id;
}

function jobsTable(jobs) {
  if (!jobs.length) return h("p", { class: "muted" }, "No jobs yet.");
  return sortableTable("Jobs, newest first", [
    { key: "id", label: "job", value: (j) => j.id, cell: jobLink },
    { key: "kind", label: "kind", value: (j) => j.kind },
    { key: "progress", label: "progress", cell: (j) => progressBar(j) },
    { key: "created", label: "created", value: (j) => j.created, cell: (j) => fmt.time(j.created), numeric: true },
  ], jobs, { rowAttrs: (j) => ({ "data-job": j.id, "data-state": j.state }) });
}

export async function homePage() {
  const [info, metricsText, datasets, probes, heads, jobs] = await Promise.all([
    api("/info"), api("/metrics", { raw: true }).then((r) => r.text()), api("/v1/datasets"),
    api("/v1/probes?limit=200"), api("/v1/heads"), api("/v1/jobs?limit=50")]);
  const mt = parseMetrics(metricsText);
  const hits = mt.layerbank_cache_hits_total || 0, misses = mt.layerbank_cache_misses_total || 0;
  const model = info.model || {};
  const modes = model.precision_modes ? Object.entries(model.precision_modes).map(([k, v]) => `${k} → ${v ?? "not on this device"}`).join(", ") : info.precision;
  const jobsBox = h("div", { id: "jobs" }, jobsTable(jobs.data));
  const regimes = jobs.data.filter((j) => j.kind === "regimes");
  const chosen = new Set();
  const compareBtn = h("button", { type: "button", disabled: true,
    onclick: () => location.assign(`/lab/compare?probes=${[...chosen].join(",")}`) }, "Compare selected probes");
  const dsById = Object.fromEntries(datasets.data.map((d) => [d.id, d]));

  page("Probe lab",
    h("div", { class: "grid2" },
      section("Model", dl([
        ["name", model.name || "no model registered yet"],
        ["layers", info.layers ?? "–"], ["width", info.hidden_size ?? "–"],
        ["hidden states", info.n_hidden_states ?? "–"],
        ["precision", `${info.precision ?? "–"} (modes: ${modes || "–"})`],
        ["default view", info.defaults ? info.defaults.description : "–"],
        ["server", `layerbank ${info.version}`]])),
      section("Store", dl([
        ["texts stored", fmt.int(mt.layerbank_store_keys)],
        ["shards", fmt.int(mt.layerbank_store_shards)],
        ["bytes on disk", fmt.bytes(mt.layerbank_store_bytes)],
        ["cache hit rate", hits + misses ? `${fmt.pct(hits / (hits + misses))} (${fmt.int(hits)} hits, ${fmt.int(misses)} misses)` : "no requests yet"],
        ["tokens encoded", fmt.int(mt.layerbank_tokens_extracted_total)]]),
        h("p", {}, h("a", { href: "/docs" }, "API documentation"), " · ", h("a", { href: "/metrics" }, "metrics")))),
    section("Jobs", jobsBox),
    section("Datasets", h("p", {}, h("a", { class: "button", href: "/lab/datasets/new" }, "Upload a dataset")),
      datasets.data.length ? sortableTable("Datasets", [
        { key: "name", label: "name", value: (d) => d.name, cell: (d) => h("a", { href: `/lab/datasets/${d.id}` }, d.name) },
        { key: "n", label: "texts", value: (d) => d.n_items, cell: (d) => fmt.int(d.n_items), numeric: true },
        { key: "task", label: "task", value: (d) => d.task },
        { key: "labels", label: "labels", value: (d) => (d.labels || []).join(", ") },
        { key: "state", label: "extraction", value: (d) => (d.job ? d.job.state : "–") },
        { key: "created", label: "created", value: (d) => d.created, cell: (d) => fmt.time(d.created), numeric: true },
      ], datasets.data) : h("p", { class: "muted" }, "No datasets yet.")),
    section("Probes", probes.data.length ? h("div", {}, sortableTable("Probes, newest first", [
      { key: "pick", label: "compare", cell: (p) => h("input", { type: "checkbox", "aria-label": `compare probe ${p.id}`,
        disabled: p.state !== "succeeded", onchange: (e) => { e.target.checked ? chosen.add(p.id) : chosen.delete(p.id);
          compareBtn.disabled = chosen.size < 1; } }) },
      { key: "id", label: "probe", value: (p) => p.id, cell: (p) => h("a", { href: `/lab/probes/${p.id}` }, p.id) },
      { key: "ds", label: "dataset", value: (p) => (dsById[p.request.dataset_id] || {}).name || p.request.dataset_id || "–" },
      { key: "state", label: "state", value: (p) => p.state },
      { key: "best", label: "best", value: (p) => (p.result && p.result.best ? p.result.best.accuracy : null),
        cell: (p) => (p.result && p.result.best ? `${p.result.best.view}, ${p.result.best.pooling}: ${fmt.num(p.result.best.accuracy)}` : "–"), numeric: true },
    ], probes.data), compareBtn) : h("p", { class: "muted" }, "No probes yet: open a dataset and run one.")),
    section("Heads", heads.data.length ? sortableTable("Saved heads", [
      { key: "name", label: "head", value: (x) => x.name, cell: (x) => h("a", { href: `/lab/heads/${x.id}` }, x.name) },
      { key: "state", label: "state", value: (x) => x.state },
      { key: "size", label: "size", value: (x) => x.size_bytes, cell: (x) => fmt.bytes(x.size_bytes), numeric: true },
    ], heads.data) : h("p", { class: "muted" }, "No heads yet: save one from a probe.")),
    section("Regimes", regimes.length ? h("ul", {}, regimes.map((j) =>
      h("li", {}, h("a", { href: `/lab/regimes/${j.id}` }, j.id), ` ${j.state}`))) : h("p", { class: "muted" }, "No regimes jobs yet.")),
  );
  // live progress: re-read the jobs while any is queued or running
  let list = jobs.data;
  while (list.some((j) => ACTIVE.includes(j.state))) {
    await sleep(1000);
    const before = list.map((j) => j.id).join();
    list = (await api("/v1/jobs?limit=50")).data;
    if (list.map((j) => j.id).join() !== before) {
      jobsBox.replaceChildren(jobsTable(list));  // a new job: the whole table
      continue;
    }
    for (const j of list) {  // the same jobs: only their progress cells, so sorting and focus stay
      const row = jobsBox.querySelector(`tr[data-job="${j.id}"]`);
      if (row) { row.dataset.state = j.state; row.cells[2].replaceChildren(progressBar(j)); }
    }
  }
}
