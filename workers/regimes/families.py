"""Where an encoder's parts are, per family: what every training regime reads.

The regimes cut a model into its layers (``top_k`` freezes the bottom ones,
``gradual`` thaws them from the top), its embeddings, its biases (``bitfit``)
and its attention query and value projections (``lora``'s targets; the
query ones' biases are ``bitfit_query``'s, ``Layout.query_modules``). Those
live under different names in every family (BERT's
``encoder.layer.N.attention.self.query``, DistilBERT's
``transformer.layer.N.attention.q_lin``, MPNet's ``...attention.attn.q``,
DeBERTa's ``query_proj``, ModernBERT's fused ``layers.N.attn.Wqkv``), so one
``Family`` per ``model_type`` says where they are, as the poolings and heads
are registered (``FAMILIES``). A parameter that is neither in a layer nor an
embedding gets a stated place:

    embeddings  below layer 0: frozen with the embeddings by ``top_k``, thawed
                last by ``gradual`` (ALBERT's ``encoder.embedding_hidden_mapping_in``
                and ELECTRA's ``embeddings_project``, which map the narrower
                embeddings to the hidden size; MPNet's shared
                ``encoder.relative_attention_bias`` and DeBERTa's
                ``encoder.rel_embeddings`` + ``encoder.LayerNorm``: position
                information every layer reads, like BERT's position embeddings)
    top         above the last layer: trained by ``top_k`` whenever a layer
                trains, thawed first by ``gradual`` (ModernBERT's ``final_norm``)
    unused      never trained: the pooler (the head reads the mean-pooled
                last hidden state, so the pooler gets no gradient)

ALBERT shares one layer (``num_hidden_groups`` = 1) across all L positions:
its block ``g`` computes positions ``g L/G .. (g+1) L/G - 1``. ``top_k`` with
k layers frozen trains every block that computes a position >= k, so for
ALBERT it trains the one shared layer whenever k < L (and then changes the
bottom k applications too: they are the same weights) and nothing but the
head when k = L. ``gradual`` thaws in the order of the highest position a
block computes, so for ALBERT it has two steps: the shared layer, then the
embeddings.

A ``model_type`` not registered is **discovered** from the module tree:
layers are the longest ``nn.ModuleList`` of blocks of one class (with
parameters); embeddings are parameters outside them under a name containing
"embed", or registered before the first layer; ``pooler`` is unused; the
rest, registered after the last layer, is ``top``; LoRA targets the Linear
modules in the blocks named like q/query/q_proj/query_proj/q_lin and
v/value/... (or, failing those, a fused qkv/Wqkv/in_proj). What cannot be
found is listed in ``Layout.missing``; ``require`` turns it into one
``UnmappableModel`` error naming it, before anything trains, and only for
the regimes that need it (``frozen``, ``bitfit`` and ``full`` need none).

Example::

    >>> layout = describe(model)
    >>> layout.source, layout.layers, layout.lora_modules[:1]
    ('registered', 'encoder.layer', ['encoder.layer.0.attention.self.query'])
    >>> require(layout, ["lora", "top_k"])     # raises UnmappableModel if not mappable
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from layerbank.cache.errors import InputError

__all__ = [
    "FAMILIES",
    "NEEDS",
    "Family",
    "Layout",
    "UnmappableModel",
    "describe",
    "layout_summary",
    "require",
    "unavailable",
    "unmappable_message",
]

# what each regime needs found in the model (keys of Layout.missing)
NEEDS: dict[str, tuple[str, ...]] = {"frozen": (), "bitfit": (), "full": (), "lora": ("layers", "lora"),
                                     "bitfit_query": ("layers", "query"),
                                     "top_k": ("layers", "places"), "gradual": ("layers", "places")}


class UnmappableModel(InputError):
    """The model's layers, or its query/value projections, could not be found."""

    default_field = "regimes"


@dataclass(frozen=True)
class Family:
    """Where one family's parts are, as names relative to the bare encoder (``AutoModel``)."""

    layers: str  # the nn.ModuleList of blocks
    lora: str  # regex, relative to one block, of the query and value projections (full match)
    embeddings: tuple[str, ...] = ("embeddings",)  # module paths below layer 0 (stated places included)
    top: tuple[str, ...] = ()  # module paths above the last layer
    unused: tuple[str, ...] = ("pooler",)
    # block index, number of blocks, config -> the layer positions the block computes
    positions: Callable[[int, int, Any], range] | None = None
    note: str = ""  # what is particular about the family (docs/regimes.md prints it)


def _albert_positions(block: int, n_blocks: int, config: Any) -> range:
    per = int(config.num_hidden_layers) // n_blocks  # ALBERT: layer i uses group i // (L / G)
    return range(block * per, (block + 1) * per)


_BERT = Family(layers="encoder.layer", lora=r"attention\.self\.(query|value)")
FAMILIES: dict[str, Family] = {
    "bert": _BERT,
    "roberta": _BERT,
    "xlm-roberta": _BERT,
    "camembert": _BERT,
    "electra": Family(layers="encoder.layer", lora=r"attention\.self\.(query|value)",
                      embeddings=("embeddings", "embeddings_project"),
                      note="embeddings_project (E -> d, when the embeddings are narrower) is placed "
                           "with the embeddings"),
    "distilbert": Family(layers="transformer.layer", lora=r"attention\.(q_lin|v_lin)",
                         note="no token type embeddings"),
    "albert": Family(layers="encoder.albert_layer_groups", lora=r"albert_layers\.\d+\.attention\.(query|value)",
                     embeddings=("embeddings", "encoder.embedding_hidden_mapping_in"),
                     positions=_albert_positions,
                     note="one layer shared by all positions: top_k trains it when k < L, gradual thaws "
                          "it at once, then the embeddings; embedding_hidden_mapping_in (E -> d) is "
                          "placed with the embeddings; LoRA adapts the shared layer once"),
    "deberta-v2": Family(layers="encoder.layer", lora=r"attention\.self\.(query_proj|value_proj)",
                         embeddings=("embeddings", "encoder.rel_embeddings", "encoder.LayerNorm"),
                         note="the relative position embeddings (encoder.rel_embeddings) and their "
                              "LayerNorm (encoder.LayerNorm), shared by every layer, are placed with the "
                              "embeddings"),
    "mpnet": Family(layers="encoder.layer", lora=r"attention\.attn\.(q|v)",
                    embeddings=("embeddings", "encoder.relative_attention_bias"),
                    note="the relative attention bias (encoder.relative_attention_bias), shared by "
                         "every layer, is placed with the embeddings"),
    "modernbert": Family(layers="layers", lora=r"attn\.Wqkv", top=("final_norm",), unused=(),
                         note="no bias terms by default, so bitfit trains only the head; Q, K and V "
                              "are one Linear (attn.Wqkv), so LoRA adapts that (keys included); "
                              "final_norm trains with the top layer"),
}

_Q = re.compile(r"(?i)^(q|query|q_proj|query_proj|q_lin|wq|to_q)$")
_V = re.compile(r"(?i)^(v|value|v_proj|value_proj|v_lin|wv|to_v)$")
_QKV = re.compile(r"(?i)^(qkv|wqkv|query_key_value|qkv_proj|in_proj|c_attn)$")


@dataclass
class Layout:
    """One model's parts: what ``trainable`` cuts at; ``missing`` says what was not found."""

    model_type: str
    architecture: str
    source: str  # "registered" or "discovered"
    layers: str | None  # dotted path of the blocks' ModuleList
    n_layers: int  # layer positions (config.num_hidden_layers; ALBERT: more than blocks)
    positions: list[range]  # per block, the positions it computes
    embeddings: tuple[str, ...]
    top: tuple[str, ...]
    unused: tuple[str, ...]
    lora_modules: list[str]  # full names of the Linear modules LoRA adapts
    note: str = ""
    # the attention query projections (bitfit_query trains their biases): the LoRA targets
    # named like a query; a fused Q/K/V Linear has none of its own
    query_modules: list[str] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)  # what -> why ("layers", "lora", "places")

    def place(self, name: str) -> tuple[str, int | None]:
        """``("layer", block)``, ``("embeddings" | "top" | "unused" | "none", None)`` of a parameter."""
        if self.layers is not None and name.startswith(self.layers + "."):
            head = name[len(self.layers) + 1:].split(".", 1)[0]
            if head.isdigit():
                return "layer", int(head)
        for kind, prefixes in (("unused", self.unused), ("embeddings", self.embeddings), ("top", self.top)):
            if any(name == p or name.startswith(p + ".") for p in prefixes):  # a module or a parameter
                return kind, None
        return "none", None

    def top_position(self, block: int) -> int:
        return self.positions[block][-1]


def _blocks(model: nn.Module, path: str) -> nn.ModuleList | None:
    try:
        found = model.get_submodule(path)
    except AttributeError:
        return None
    return found if isinstance(found, nn.ModuleList) else None


def _n_layers(model: nn.Module, default: int) -> int:
    value = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    return int(value) if isinstance(value, int) else default


def _registered(model: nn.Module, model_type: str, family: Family) -> Layout:
    blocks = _blocks(model, family.layers)
    n_blocks = len(blocks) if blocks is not None else 0
    n_layers = _n_layers(model, n_blocks)
    config = getattr(model, "config", None)
    positions = [family.positions(b, n_blocks, config) if family.positions else range(b, b + 1)
                 for b in range(n_blocks)]
    lora = re.compile(rf"{re.escape(family.layers)}\.\d+\.{family.lora}")
    layout = Layout(model_type, type(model).__name__, "registered", family.layers if blocks is not None else None,
                    n_layers, positions, family.embeddings, family.top, family.unused,
                    [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and lora.fullmatch(n)],
                    family.note)
    if blocks is None:
        layout.missing["layers"] = f"no nn.ModuleList at {family.layers!r} (the {model_type} description)"
    elif family.positions is None and n_blocks != n_layers:
        layout.missing["layers"] = (f"{family.layers!r} holds {n_blocks} blocks but the config says "
                                    f"{n_layers} layers")
    if not layout.lora_modules:
        layout.missing["lora"] = (f"no Linear module matches {family.layers}.N.{family.lora} "
                                  f"(the {model_type} description's query/value projections)")
    return layout


def _discovered(model: nn.Module, model_type: str) -> Layout:
    best: tuple[int, int, str] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or not len(module):
            continue
        kinds = {type(child) for child in module}
        size = sum(p.numel() for p in module.parameters())
        if len(kinds) == 1 and size and (best is None or (len(module), size) > best[:2]):
            best = (len(module), size, name)
    names = [n for n, _ in model.named_parameters()]
    layout = Layout(model_type, type(model).__name__, "discovered", None, _n_layers(model, 0), [], (), (),
                    (), [], "discovered from the module tree: no registered description")
    if best is None:
        layout.missing["layers"] = "no nn.ModuleList of blocks of one class with parameters"
        return layout
    n_blocks, _, path = best
    layout.layers = path
    if layout.n_layers != n_blocks:
        layout.missing["layers"] = (f"the longest block list, {path!r}, holds {n_blocks} blocks but the config "
                                    f"says {layout.n_layers} layers (shared layers? register the family)")
    layout.positions = [range(b, b + 1) for b in range(n_blocks)]
    inside = [i for i, n in enumerate(names) if n.startswith(path + ".")]
    first, last = (inside[0], inside[-1]) if inside else (len(names), len(names))
    emb, top, unused = [], [], []
    for i, name in enumerate(names):
        if name.startswith(path + "."):
            continue
        parts = name.split(".")
        if "pooler" in parts:
            unused.append(name)
        elif any("embed" in part.lower() for part in parts[:-1]) or i < first:
            emb.append(name)
        elif i > last:
            top.append(name)
    layout.embeddings, layout.top, layout.unused = tuple(emb), tuple(top), tuple(unused)
    linears = [(n, n.rsplit(".", 1)[-1]) for n, m in model.named_modules()
               if isinstance(m, nn.Linear) and n.startswith(path + ".")]
    q = [n for n, leaf in linears if _Q.match(leaf)]
    v = [n for n, leaf in linears if _V.match(leaf)]
    fused = [n for n, leaf in linears if _QKV.match(leaf)]
    layout.lora_modules = q + v if q and v else fused
    if not layout.lora_modules:
        layout.missing["lora"] = (f"no query and value projections in {path!r}: no Linear named "
                                  "q/query/q_proj/query_proj/q_lin with v/value/v_proj/value_proj/v_lin, "
                                  "nor a fused qkv/Wqkv/in_proj")
    return layout


def _find_query(model: nn.Module, layout: Layout) -> None:
    """The query projections among the LoRA targets; a fused Q/K/V with a bias cannot give
    its query part alone (one tensor), so ``bitfit_query`` is then unmappable; without a
    bias (ModernBERT's default) there is simply no query bias, and it trains only the head."""
    layout.query_modules = [n for n in layout.lora_modules if _Q.match(n.rsplit(".", 1)[-1])]
    modules = dict(model.named_modules())
    fused = [n for n in layout.lora_modules if _QKV.match(n.rsplit(".", 1)[-1])]
    if any(getattr(modules[n], "bias", None) is not None for n in fused):
        layout.missing["query"] = (f"the query projection is fused with the key and value ones in {fused[0]!r}: "
                                   "its query bias is not a parameter of its own")
    elif not layout.query_modules and not fused:
        layout.missing["query"] = "no query projection found (" + layout.missing.get("lora", "none named") + ")"


def describe(model: nn.Module) -> Layout:
    """The layout of a bare encoder: registered for its ``model_type``, else discovered. Never raises."""
    model_type = str(getattr(getattr(model, "config", None), "model_type", "") or "")
    family = FAMILIES.get(model_type)
    layout = _registered(model, model_type, family) if family else _discovered(model, model_type)
    _find_query(model, layout)
    if "layers" not in layout.missing:
        stray = [n for n, _ in model.named_parameters() if layout.place(n)[0] == "none"]
        if stray:
            more = f" and {len(stray) - 3} more" if len(stray) > 3 else ""
            layout.missing["places"] = (f"parameters in no layer, not an embedding and with no stated place: "
                                        f"{', '.join(stray[:3])}{more}")
    return layout


def unavailable(layout: Layout, regimes: Sequence[str]) -> dict[str, str]:
    """Regime -> why it cannot run on this layout (empty: all can)."""
    out = {}
    for regime in regimes:
        whys = [layout.missing[k] for k in NEEDS.get(regime, ()) if k in layout.missing]
        if whys:
            out[regime] = "; ".join(dict.fromkeys(whys))
    return out


def unmappable_message(name: str, model_type: str, architecture: str, source: str,
                       why: Mapping[str, str]) -> str:
    """One line naming what was not found, and for which regimes (also used over HTTP)."""
    reasons = "; ".join(dict.fromkeys(why.values()))
    known = ", ".join(sorted(FAMILIES))
    how = "its registered description" if source == "registered" else \
        f"its module tree (model_type {model_type!r} is not one of: {known})"
    return (f"model {name} ({architecture}) cannot be mapped for regimes {sorted(why)}: {reasons}. "
            f"Looked in {how}; frozen, bitfit and full need none of this")


def require(layout: Layout, regimes: Sequence[str], name: str | None = None) -> None:
    """Raise ``UnmappableModel`` (one line) if any of ``regimes`` needs a part that was not found."""
    why = unavailable(layout, regimes)
    if why:
        raise UnmappableModel(unmappable_message(name or repr(layout.model_type or layout.architecture),
                                                 layout.model_type, layout.architecture, layout.source, why))


def layout_summary(model: nn.Module) -> dict[str, Any]:
    """What the HTTP layer needs to refuse a regime without torch: a JSON-able dict for the model info."""
    layout = describe(model)
    return {"model_type": layout.model_type, "architecture": layout.architecture, "source": layout.source,
            "layers": layout.layers, "n_layers": layout.n_layers, "lora_targets": layout.lora_modules[:4],
            "query_targets": layout.query_modules[:2],
            "unavailable": unavailable(layout, list(NEEDS))}
