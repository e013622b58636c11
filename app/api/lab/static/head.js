// One saved head: what it was fitted on, its size beside a full fine-tune and a
// LoRA adapter, and a text box that classifies a sentence through the predict route.
import { api, streamEvents } from "./api.js";
import { h, page, section, fmt, dl, progressBar, showError, main } from "./ui.js";
import { bars, COLORS } from "./charts.js";

function sizes(hd) {
  const st = hd.storage;
  if (!st) return h("p", { class: "muted" }, "Sizes appear once the head is fitted.");
  // the head's fitted arrays (storage.frozen_head_bytes): the figure the probe's advice gives,
  // on the basis of the others (the numbers kept, no file container)
  const mine = st.frozen_head_bytes;
  const items = [
    { label: "this head", value: mine },
    { label: "LoRA r=8 (q, v)", value: st.lora_r8_bytes },
    { label: "BitFit", value: st.bitfit_bytes },
    { label: "full fine-tune", value: st.full_finetune_bytes },
  ].filter((x) => x.value);
  return h("figure", { id: "sizes" },
    bars(items.map((x, i) => ({ ...x, text: `${fmt.bytes(x.value)}${i ? ` (${fmt.int(Math.round(x.value / mine))}x)` : ""}`,
      color: COLORS[i] })), { title: "bytes stored per task (log scale)", log: true }),
    h("figcaption", {}, "Bytes of the numbers each option stores beside the shared encoder (log scale; the factor is " +
      `against this head). Its files on disk, with their container and metadata: ${fmt.bytes(hd.size_bytes)}.`));
}

function predictForm(hd) {
  const text = h("textarea", { id: "predict-text", rows: 3, required: true, placeholder: "Type a sentence" });
  const out = h("div", { id: "prediction", "aria-live": "polite" });
  const form = h("form", { class: "card", id: "predict-form" },
    h("label", { for: "predict-text" }, "Text to classify"), text,
    h("button", { type: "submit", id: "predict" }, "Predict"), out);
  form.onsubmit = async (e) => {
    e.preventDefault();
    try {
      const r = await api(`/v1/heads/${encodeURIComponent(hd.id)}/predict`, { method: "POST", json: { texts: [text.value] } });
      const d = r.data[0];
      out.replaceChildren(
        h("p", {}, "Predicted label: ", h("strong", { id: "predicted-label" }, String(d.label)),
          ` (${d.cached ? "features from the cache" : `encoded now, ${r.usage.tokens_computed} tokens`})`),
        bars(r.classes.map((c, i) => ({ label: c, value: d.probabilities[i], text: d.probabilities[i].toFixed(3),
          color: c === d.label ? COLORS[0] : "#999" })), { title: "class probabilities", max: 1 }),
        h("table", { class: "data", id: "probabilities" }, h("caption", {}, "Class probabilities"),
          // 3 digits, as every score in the lab; the exact value in data-value (and the tooltip)
          h("tbody", {}, r.classes.map((c, i) => h("tr", { "data-class": String(c) }, h("th", { scope: "row" }, String(c)),
            h("td", { class: "num", "data-value": String(d.probabilities[i]), title: String(d.probabilities[i]) },
              fmt.num(d.probabilities[i])))))));
    } catch (err) { showError(out, err); }
  };
  return form;
}

export async function headPage(id) {
  let hd = await api(`/v1/heads/${encodeURIComponent(id)}`);
  const prog = h("div", { id: "progress", "aria-live": "polite" }, progressBar(hd));
  const after = h("div", {});
  page(`Head ${hd.name}`, section("Fitting", prog), after);
  if (["queued", "running"].includes(hd.state)) {
    await streamEvents(`/v1/jobs/${encodeURIComponent(hd.job_id)}/events`, (_n, j) => prog.replaceChildren(progressBar(j)));
    hd = await api(`/v1/heads/${encodeURIComponent(id)}`);
    prog.replaceChildren(progressBar(hd));
  }
  const fp = hd.from_probe;
  after.append(
    section("Fitted on", dl([["id", hd.id], ["dataset", h("a", { href: `/lab/datasets/${hd.dataset}` }, hd.dataset)],
      ["head", hd.head], ["view", hd.view], ["pooling", hd.pooling], ["model", hd.model.name],
      ["examples", fmt.int(hd.n_examples)], ["classes", (hd.classes || []).join(", ")],
      ["class counts", hd.class_counts ? Object.entries(hd.class_counts).map(([k, v]) => `${k}: ${v}`).join(", ") : "–"],
      fp ? ["from probe", h("span", {}, h("a", { href: `/lab/probes/${fp.id}` }, fp.id),
        ` (best there: ${fp.view}, ${fp.pooling}, accuracy ${fmt.num(fp.accuracy)} ± ${fmt.num(fp.accuracy_std)})`)] : null,
      ["files", Object.entries(hd.files || {}).map(([k, v]) => `${k} ${fmt.bytes(v)}`).join(", ") || "–"],
      ["created", fmt.time(hd.created)]])),
    section("Size", sizes(hd)),
    hd.state === "succeeded" ? section("Try it", predictForm(hd)) : h("p", {}, `This head ${hd.state}${hd.error ? `: ${hd.error}` : ""}.`));
  main().setAttribute("data-ready", "true");
}
