// One regimes job: score against training size per regime with its spread,
// trainable share and bytes per task, and the verdict; the layer-cut curve
// (score against fine-tuned layers, full's score and 90% of it), the crossover
// of fine-tuning over the frozen probe, and which layers each fine-tune moved.
import { api, streamEvents } from "./api.js";
import { h, page, section, fmt, dl, progressBar, sortableTable, main } from "./ui.js";
import { lineChart, legend, bars } from "./charts.js";

// The layer-cut curve (Lee et al.): one point per top_k cut, full and its 90% as lines.
function layerCut(cut) {
  const series = [{ id: "top_k", label: "top_k (embeddings and the bottom layers frozen)", connect: true,
    points: cut.points.map((p) => ({ x: p.fine_tuned_layers, y: p.macro_f1_mean, std: p.macro_f1_std,
      name: `${p.variant}: ${p.fine_tuned_layers} fine-tuned layers`, attrs: { "data-regime": p.variant } })) }];
  const hlines = cut.full ? [{ y: cut.full.macro_f1_mean, label: "full" }, { y: cut.target, label: "90% of full" }] : [];
  const mark = cut.fewest_layers_at_90 == null ? null : { series: "top_k", x: cut.fewest_layers_at_90, label: "fewest at 90%" };
  const ticks = Array.from({ length: cut.n_layers + 1 }, (_, x) => ({ x, label: String(x) }));
  return h("figure", { id: "layer-cut-chart" }, lineChart({ title: "test macro-F1 against fine-tuned layers",
    yLabel: "test macro-F1", xLabel: `fine-tuned layers (of ${cut.n_layers})`, series, hlines, mark, xTicks: ticks }),
  h("figcaption", { id: "layer-cut-verdict" }, cut.verdict));
}

// Which parts each fine-tune moved: ||after - before|| / ||before||, mean over seeds.
function updates(regimes) {
  const rows = Object.entries(regimes).filter(([, r]) => r.layer_updates);
  return rows.map(([name, r]) => h("details", { "data-regime": name }, h("summary", {}, name),
    bars(Object.entries(r.layer_updates).map(([part, v]) => ({ label: part, value: v, text: v.toExponential(2) })),
      { title: `relative change per part: ${name}` })));
}

function chart(result) {
  const curve = result.learning_curve || [{ train_size: result.split.n_train, regimes: result.regimes }];
  const names = Object.keys(curve[curve.length - 1].regimes);
  const sizes = curve.map((c) => c.train_size);
  const one = sizes.length === 1;
  // one training size: score against what a task stores (log scale), the trade-off to choose on;
  // several sizes: score against training size, one line per regime
  const last = curve[curve.length - 1].regimes;
  const bx = (n) => Math.log10(Math.max(1, last[n].bytes_per_task));
  const series = names.map((n) => ({ id: n, label: n, connect: !one,
    points: curve.filter((c) => c.regimes[n]).map((c) => ({ x: one ? bx(n) : c.train_size, y: c.regimes[n].macro_f1_mean,
      std: c.regimes[n].macro_f1_std || 0, name: `${n}, ${c.train_size} examples`, label: one ? n : null,
      attrs: { "data-regime": n } })) }));
  const cross = result.crossover;
  let mark = null;
  if (!one && cross && cross.status === "crosses") {  // where fine-tuning overtakes the frozen probe
    const i = cross.sizes.findIndex((n) => n >= cross.at);
    const fz = (k) => curve.find((c) => c.train_size === cross.sizes[k]).regimes.frozen.macro_f1_mean;
    const y = i <= 0 ? fz(0) : fz(i - 1) + (fz(i) - fz(i - 1)) * (cross.at - cross.sizes[i - 1]) / (cross.sizes[i] - cross.sizes[i - 1]);
    series.push({ id: "crossover", label: `crossover: ${cross.regime} overtakes frozen`, connect: false,
      points: [{ x: cross.at, y, std: 0, name: `crossover at ${Math.round(cross.at)} training texts` }] });
    mark = { series: "crossover", x: cross.at, label: `${Math.round(cross.at)}` };
  }
  const svg = lineChart({ title: "test macro-F1 (mean ± std over seeds)", yLabel: "test macro-F1",
    xLabel: one ? `bytes stored per task, log scale (${sizes[0]} training examples)` : "training examples", series, mark,
    xTicks: one ? names.map((n) => ({ x: bx(n), label: fmt.bytes(last[n].bytes_per_task) })) : sizes.map((x) => ({ x, label: String(x) })) });
  return h("figure", { id: "regimes-chart" }, svg, legend(series),
    h("figcaption", {}, seedCount(result) === 1 ? `${NO_SPREAD}: no whiskers or bands; run more seeds to see the spread.`
      : `Whiskers and bands: ± one standard deviation over ${seedCount(result)} seeds.`));
}

// the CLI's words (layerbank.app.probes.regimes_plot.NO_SPREAD)
const NO_SPREAD = "1 seed: no spread";

function seedCount(result) {
  const seeds = (result.settings || {}).seeds;
  return Array.isArray(seeds) ? seeds.length : Number(seeds);
}

export async function regimesPage(id) {
  let r = await api(`/v1/regimes/${encodeURIComponent(id)}`);
  const prog = h("div", { id: "progress", "aria-live": "polite" }, progressBar(r));
  const after = h("div", {});
  const req = r.request || {};
  page(`Regimes ${id}`, dl([["dataset", h("a", { href: `/lab/datasets/${req.dataset_id}` }, req.dataset_id || "–")],
    ["regimes", (req.regimes || []).join(", ")], ["seeds", req.seeds], ["max epochs", req.max_epochs]]),
  section("Progress", prog), after);
  if (["queued", "running"].includes(r.state)) {
    await streamEvents(`/v1/jobs/${encodeURIComponent(id)}/events`, (_n, j) => prog.replaceChildren(progressBar(j)));
    r = await api(`/v1/regimes/${encodeURIComponent(id)}`);
    prog.replaceChildren(progressBar(r));
  }
  if (r.state !== "succeeded") {
    after.append(h("p", {}, `This regimes job ${r.state}${r.error ? `: ${r.error}` : ""}.`));
    main().setAttribute("data-ready", "true");  // finished, with nothing more to draw
    return;
  }
  const res = r.result;
  const rows = Object.entries(res.regimes).map(([name, v]) => ({ name, ...v }));
  // one seed has no spread: say so, as the command line does, rather than "± 0.000"
  const oneSeed = seedCount(res) === 1;
  after.append(...[
    section("Verdict", h("p", { id: "verdict" }, `Best: `, h("strong", {}, res.best),
      `. Within one standard deviation of it: ${(res.within_noise || []).join(", ")}. Cheapest of those: `,
      h("strong", {}, res.cheapest_within_one_std), ` (scored on ${res.split.n_test} test texts; ${res.score}).`)),
    section("Score", chart(res), res.crossover ? h("p", { id: "crossover" }, `Crossover: ${res.crossover.verdict}.`) : null),
    res.layer_cut ? section("Layer cut", layerCut(res.layer_cut)) : null,
    (res.xi_sweep || []).length ? section("Rate factor sweep", h("ul", { id: "xi-sweep" },
      res.xi_sweep.map((x) => h("li", {}, x.verdict)))) : null,
    section("Every regime", sortableTable("Regimes (click a header to sort)", [
      { key: "name", label: "regime", value: (x) => x.name },
      { key: "f1", label: "macro-F1", value: (x) => x.macro_f1_mean, cell: (x) => oneSeed ? `${fmt.num(x.macro_f1_mean)} (${NO_SPREAD})` : `${fmt.num(x.macro_f1_mean)} ± ${fmt.num(x.macro_f1_std)}`, numeric: true },
      { key: "acc", label: "accuracy", value: (x) => x.accuracy_mean, cell: (x) => fmt.num(x.accuracy_mean), numeric: true },
      { key: "share", label: "trainable share", value: (x) => x.trainable_share, cell: (x) => fmt.pct(x.trainable_share, 3), numeric: true },
      { key: "params", label: "trainable params", value: (x) => x.trainable_params, cell: (x) => fmt.int(x.trainable_params), numeric: true },
      { key: "bytes", label: "bytes per task", value: (x) => x.bytes_per_task, cell: (x) => fmt.bytes(x.bytes_per_task), numeric: true },
    ], rows, { sortBy: "f1", rowAttrs: (x) => ({ "data-regime": x.name }) })),
    section("Layerwise updates", h("p", { class: "muted" }, "||θ after − θ before|| / ||θ before|| per part, mean over seeds; 0 where nothing trained."),
      ...updates(res.regimes)),
    section("Split", dl([["train", res.split.n_train], ["validation", res.split.n_val], ["test", res.split.n_test],
      ["split seed", res.split.split_seed], ["classes", (res.classes || []).join(", ")]]))].filter(Boolean));
  main().setAttribute("data-ready", "true");
}
