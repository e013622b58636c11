// Datasets: upload (file picker or drag-and-drop, columns chosen from a preview),
// then one dataset's extraction progress (the job's event stream), its labels and
// token lengths, and the buttons that start a probe, a regimes job or a download.
import { api, streamEvents, download } from "./api.js";
import { h, page, section, fmt, dl, progressBar, showError, main } from "./ui.js";
import { bars, histogram, COLORS } from "./charts.js";

const FORMATS = { csv: "csv", tsv: "tsv", jsonl: "jsonl", txt: "txt", conll: "conll" };
const PREVIEW_BYTES = 64 * 1024;
const PREVIEW_ROWS = 5;

// One delimited line, with "quoted, fields" (enough for a preview; the server parses the file).
function splitLine(line, sep) {
  const out = [];
  let cur = "", q = false;
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (q) {
      if (c === '"' && line[i + 1] === '"') { cur += '"'; i++; } else if (c === '"') q = false; else cur += c;
    } else if (c === '"' && cur === "") q = true;
    else if (c === sep) { out.push(cur); cur = ""; } else cur += c;
  }
  out.push(cur);
  return out;
}

export function preview(text, fmt) {
  const lines = text.split(/\r?\n/).filter((l) => l.trim() !== "");
  if (fmt === "csv" || fmt === "tsv") {
    const sep = fmt === "csv" ? "," : "\t";
    const [head, ...rest] = lines.slice(0, PREVIEW_ROWS + 1).map((l) => splitLine(l, sep));
    return { columns: head || [], rows: rest };
  }
  if (fmt === "jsonl") {
    const objs = lines.slice(0, PREVIEW_ROWS).map((l) => { try { return JSON.parse(l); } catch (_) { return {}; } });
    const columns = [...new Set(objs.flatMap((o) => Object.keys(o)))];
    return { columns, rows: objs.map((o) => columns.map((c) => (o[c] === undefined ? "" : String(o[c])))) };
  }
  return { columns: [fmt === "conll" ? "word  tag …" : "text"], rows: lines.slice(0, PREVIEW_ROWS).map((l) => [l]) };
}

function guessText(cols) {
  return cols.find((c) => /^(text|sentence|review|content|body)$/i.test(c)) || cols[0];
}

function guessLabel(cols) {
  return cols.find((c) => /^(label|labels|y|target|class|category)$/i.test(c)) || "";
}

export async function uploadPage() {
  const fileInput = h("input", { type: "file", id: "file", accept: ".csv,.tsv,.jsonl,.txt,.conll" });
  const drop = h("div", { class: "drop", id: "drop", "aria-describedby": "drop-help" },
    h("p", { id: "drop-help" }, "Drop a CSV, TSV, JSONL, TXT or CoNLL file here, or choose one: "),
    h("label", { for: "file" }, "File "), fileInput);
  const out = h("div", { id: "preview" });
  const form = h("form", { class: "card", id: "upload" }, drop, out);
  page("Upload a dataset", h("p", {}, "The first rows are shown before anything is sent, so you can pick the text and label columns."), form);

  const choose = async (file) => {
    const ext = (file.name.split(".").pop() || "").toLowerCase();
    const format = FORMATS[ext];
    if (!format) { showError(out, new Error(`cannot tell the format of ${file.name}; use .csv, .tsv, .jsonl, .txt or .conll`)); return; }
    const text = await file.slice(0, PREVIEW_BYTES).text();
    const pv = preview(text, format);
    const named = format === "csv" || format === "tsv" || format === "jsonl";
    const textSel = h("select", { id: "text-column" }, pv.columns.map((c) => h("option", { value: c, selected: c === guessText(pv.columns) }, c)));
    const labelSel = h("select", { id: "label-column" }, h("option", { value: "" }, "(no labels)"),
      pv.columns.map((c) => h("option", { value: c, selected: c === guessLabel(pv.columns) }, c)));
    const name = h("input", { id: "name", value: file.name.replace(/\.[^.]+$/, "") });
    const send = h("button", { type: "submit", id: "send" }, "Upload and extract");
    out.replaceChildren(
      h("div", { class: "table-wrap" }, h("table", { class: "data", id: "preview-table" },
        h("caption", {}, `${file.name}: first ${pv.rows.length} rows (${format}, ${(file.size / 1000).toFixed(1)} kB)`),
        h("thead", {}, h("tr", {}, pv.columns.map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, pv.rows.map((r) => h("tr", {}, r.map((v) => h("td", {}, v))))))),
      h("div", { class: "fields" },
        h("label", { for: "name" }, "Name"), name,
        named ? [h("label", { for: "text-column" }, "Text column"), textSel,
          h("label", { for: "label-column" }, "Label column"), labelSel] : null),
      send);
    form.onsubmit = async (e) => {
      e.preventDefault();
      send.disabled = true;
      const fd = new FormData();
      fd.append("file", file, file.name);
      fd.append("name", name.value);
      if (named) {
        fd.append("text_column", textSel.value);
        if (labelSel.value) fd.append("label_column", labelSel.value);
      }
      try {
        const ds = await api("/v1/datasets", { method: "POST", form: fd });
        location.assign(`/lab/datasets/${encodeURIComponent(ds.id)}`);
      } catch (err) {
        send.disabled = false;
        showError(out, err);
      }
    };
  };
  fileInput.addEventListener("change", () => fileInput.files[0] && choose(fileInput.files[0]));
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    const f = e.dataTransfer.files[0];
    if (f) choose(f);
  });
}

function statsView(st) {
  const t = st.tokens;
  const labels = st.labels ? Object.entries(st.labels) : [];
  const total = labels.reduce((a, [, n]) => a + n, 0);
  return h("div", { id: "stats" },
    labels.length ? section("Labels", bars(labels.map(([k, n], i) => ({ label: k, value: n, text: `${n} (${fmt.pct(n / total)})`,
      color: COLORS[i % COLORS.length] })), { title: "Texts per label" })) : h("p", {}, "No labels: probes and heads need a labelled dataset."),
    section("Token lengths",
      dl([["texts", fmt.int(t.stored)], ["tokens per text", `min ${t.min}, median ${t.median}, mean ${fmt.num(t.mean, 1)}, max ${t.max}`],
        ["max_length", t.max_length ?? "–"],
        ["truncated", h("span", { id: "truncated" }, `${fmt.int(t.truncated)} of ${fmt.int(t.stored)} (${fmt.pct(t.truncated_share)})`)]]),
      t.histogram.counts.length ? histogram(t.histogram.edges, t.histogram.counts,
        { title: "Texts by token count", xLabel: "tokens per text (special tokens included)", limit: t.max_length }) : null));
}

function probeForm(ds, info) {
  const box = (name, value, label, checked) => h("label", { class: "check" },
    h("input", { type: "checkbox", name, value, checked }), ` ${label}`);
  const form = h("form", { class: "card", id: "probe-form" },
    h("h3", {}, "Run a probe"),
    h("fieldset", {}, h("legend", {}, "Views"),
      box("views", "each_layer", "every layer", true), box("views", "concat_last_4", "concat last 4", false),
      box("views", "mean_all", "mean of all", false), box("views", "scalar_mix", "learned scalar mix", true)),
    h("fieldset", {}, h("legend", {}, "Poolings"),
      (info.poolings || ["mean", "cls", "max"]).map((p) => box("poolings", p, p === "cls" ? "[CLS]" : p.replace("_", " "),
        p === "mean" || p === "cls"))),
    h("div", { class: "fields" },
      h("label", { for: "probe-head" }, "Head"),
      h("select", { id: "probe-head", name: "head" }, (info.heads || []).map((x) => h("option", { value: x }, x))),
      h("label", { for: "probe-cv" }, "Folds"),
      h("select", { id: "probe-cv", name: "cv" }, [3, 5, 10].map((x) => h("option", { value: x, selected: x === 5 }, x)))),
    box("control_task", "1", "control task (shuffled labels)", true),
    box("learning_curve", "1", "learning curve", true),
    h("button", { type: "submit", id: "run-probe" }, "Run probe"));
  form.onsubmit = async (e) => {
    e.preventDefault();
    const f = new FormData(form);
    const body = { dataset: ds.id, views: f.getAll("views"), poolings: f.getAll("poolings"), head: f.get("head"),
      cv: Number(f.get("cv")), control_task: f.has("control_task"), learning_curve: f.has("learning_curve") };
    if (body.learning_curve) {  // points that fit inside one training fold of this dataset
      const train = Math.floor(ds.n_items * (1 - 1 / body.cv));
      body.train_sizes = [25, 50, 100, 200, 500, 1000].filter((n) => n < train);
      if (!body.train_sizes.length) body.learning_curve = false;
    }
    try {
      const p = await api("/v1/probes", { method: "POST", json: body });
      location.assign(`/lab/probes/${encodeURIComponent(p.id)}`);
    } catch (err) { showError(form, err); }
  };
  return form;
}

function regimesForm(ds) {
  const names = ["frozen", "bitfit", "lora", "top_k", "gradual", "full"];
  const form = h("form", { class: "card", id: "regimes-form" },
    h("h3", {}, "Freeze or fine-tune: run regimes"),
    h("p", { class: "muted" }, "Fine-tuning runs the encoder in the worker; on a CPU the full regimes take minutes per seed."),
    h("fieldset", {}, h("legend", {}, "Regimes"), names.map((n) => h("label", { class: "check" },
      h("input", { type: "checkbox", name: "regimes", value: n, checked: true }), ` ${n}`))),
    h("div", { class: "fields" },
      h("label", { for: "regimes-seeds" }, "Seeds"), h("input", { id: "regimes-seeds", name: "seeds", type: "number", min: 1, max: 20, value: 3 }),
      h("label", { for: "regimes-epochs" }, "Max epochs"), h("input", { id: "regimes-epochs", name: "max_epochs", type: "number", min: 1, max: 100, value: 10 }),
      h("label", { for: "regimes-sizes" }, "Training sizes"),
      h("input", { id: "regimes-sizes", name: "train_sizes", placeholder: "e.g. 50, 100 (empty: the whole train split)",
        inputmode: "numeric", pattern: "[0-9 ,]*" })),
    h("button", { type: "submit", id: "run-regimes" }, "Run regimes"));
  form.onsubmit = async (e) => {
    e.preventDefault();
    const f = new FormData(form);
    try {
      const body = { dataset: ds.id, regimes: f.getAll("regimes"), seeds: Number(f.get("seeds")),
        max_epochs: Number(f.get("max_epochs")) };
      const sizes = String(f.get("train_sizes") || "").split(/[ ,]+/).filter(Boolean).map(Number);
      if (sizes.length) body.train_sizes = sizes;  // a learning curve: the page draws score against size
      const r = await api("/v1/regimes", { method: "POST", json: body });
      location.assign(`/lab/regimes/${encodeURIComponent(r.id)}`);
    } catch (err) { showError(form, err); }
  };
  return form;
}

function downloadForm(ds, info) {
  const view = h("input", { id: "dl-view", value: (info.defaults && info.defaults.view) || "layer:-2" });
  const pooling = h("select", { id: "dl-pooling" }, (info.poolings || ["mean", "cls", "max"]).map((p) =>
    h("option", { value: p, selected: info.defaults && p === info.defaults.pooling }, p)));
  const form = h("form", { class: "card", id: "download-form" }, h("h3", {}, "Download features"),
    h("div", { class: "fields" }, h("label", { for: "dl-view" }, "View"), view, h("label", { for: "dl-pooling" }, "Pooling"), pooling),
    h("p", { class: "muted" }, "Rows in dataset order, float32. .npy: the matrix (np.load); .parquet: columns text and ",
      "features (pyarrow or pandas). Views: layer:K, concat_last_4, mean_all, all_layers, …",
      " As /v1/features: the view as stored (default layer:-2, mean), unnormalised; /v1/embeddings ",
      "answers the model's own sentence embedding instead (its sentence-transformers recipe, GET /info)."),
    h("button", { type: "submit", id: "download-npy", value: "npy" }, "Download .npy"), " ",
    h("button", { type: "submit", id: "download-parquet", value: "parquet" }, "Download .parquet"));
  form.onsubmit = async (e) => {
    e.preventDefault();
    const format = (e.submitter && e.submitter.value) || "npy";
    const q = new URLSearchParams({ view: view.value, pooling: pooling.value, format });
    const name = `${ds.name}-${view.value.replace(/[^\w-]/g, "_")}-${pooling.value}.${format}`;
    try { await download(`/v1/datasets/${encodeURIComponent(ds.id)}/features?${q}`, name); } catch (err) { showError(form, err); }
  };
  return form;
}

export async function datasetPage(id) {
  const [ds, info] = await Promise.all([api(`/v1/datasets/${encodeURIComponent(id)}`), api("/info")]);
  const prog = h("div", { id: "progress", "aria-live": "polite" }, progressBar(ds.job));
  const after = h("div", { id: "after" });
  page(`Dataset ${ds.name}`,
    dl([["id", ds.id], ["texts", fmt.int(ds.n_items)], ["task", ds.task], ["source", ds.source || "JSON"],
      ["labels", (ds.labels || []).join(", ") || "none"], ["precision", ds.precision || "–"], ["model", ds.model],
      ["created", fmt.time(ds.created)], ds.skipped_empty ? ["empty lines skipped", ds.skipped_empty] : null]),
    section("Extraction", prog), after);
  let job = ds.job;
  if (job && ["queued", "running"].includes(job.state)) {
    await streamEvents(`/v1/jobs/${encodeURIComponent(job.id)}/events`, (name, j) => {
      job = j;
      prog.replaceChildren(progressBar(j));
    });
  }
  if (!job || job.state !== "succeeded") {
    after.append(h("p", {}, "Nothing to show until the extraction has succeeded."));
    main().setAttribute("data-ready", "true");  // finished, with nothing more to draw
    return;
  }
  const st = await api(`/v1/datasets/${encodeURIComponent(id)}/stats`);
  const labelled = st.labels && ds.task === "sentence";
  after.replaceChildren(statsView(st),
    section("Next", h("div", { class: "grid2" }, labelled ? [probeForm(ds, info), regimesForm(ds)] : null, downloadForm(ds, info))));
  main().setAttribute("data-ready", "true");
}
