"""The issue-18 peers of bench/extract.py: faster matrix libraries and the length-sorted loop.

- ``sorted_loop_run``: a plain transformers loop that sorts texts by length
  first (batches of 32, all-layer mean pooling): the best plain loop measured.
- ``onednn_linear``: every ``nn.Linear`` of a model sent through oneDNN
  (``torch.ops.mkldnn._linear_pointwise``, the kernel torch's own inductor
  uses on CPU) instead of torch's default BLAS (MKL on x86).
- ``matmul_bounds``: FLOP/s of one layer's matrix shapes through torch's
  BLAS, oneDNN and ONNX Runtime, so the compute bound printed is against the
  fastest library this machine has, not against MKL alone.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

__all__ = ["matmul_bounds", "onednn_linear", "sorted_loop_run"]


def sorted_loop_run(texts: list[str], model: Any, tok: Any, real_tokens: int,
                    max_length: int) -> Callable[[], dict[str, Any]]:
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    ordered = [texts[i] for i in order]

    @torch.inference_mode()
    def run() -> dict[str, Any]:
        c0, t0 = time.process_time(), time.perf_counter()
        for i in range(0, len(ordered), 32):
            b = tok(ordered[i:i + 32], padding=True, truncation=True, max_length=max_length,
                    return_tensors="pt")
            out = model(**b, output_hidden_states=True)
            m = b["attention_mask"][:, :, None].float()
            torch.stack([(h * m).sum(1) / m.sum(1) for h in out.hidden_states], 1).numpy()
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {"tokens_per_second": real_tokens / dt, "seconds": dt,
                "tokens_per_cpu_second": real_tokens / cpu}
    return run


def _onednn_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    shape = x.shape
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, shape[-1]), self.weight, self.bias,
                                           "none", [None], "")
    return y.reshape(*shape[:-1], y.shape[-1])


@contextlib.contextmanager
def onednn_linear(model: Any) -> Iterator[None]:
    """Within the block, the model's Linear layers run on oneDNN (same weights, same numbers within 1e-5)."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    for m in linears:
        m.forward = _onednn_forward.__get__(m)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for m in linears:
            del m.forward


def _best_seconds(fn: Callable[[], object], repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_bounds(hidden: int, intermediate: int, tokens: int = 2048) -> dict[str, float]:
    """FLOP/s of [tokens, d] x [d, d_ff], [tokens, d_ff] x [d_ff, d] and 4 x [tokens, d] x [d, d]
    (one layer's linear work) in fp32 through each library that can be timed here."""
    flops = 2.0 * tokens * (2 * hidden * intermediate + 4 * hidden * hidden)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((tokens, hidden), dtype=np.float32)
    h = rng.standard_normal((tokens, intermediate), dtype=np.float32)
    w_up = rng.standard_normal((intermediate, hidden), dtype=np.float32)  # Linear's [out, in]
    w_down = rng.standard_normal((hidden, intermediate), dtype=np.float32)
    w_sq = rng.standard_normal((hidden, hidden), dtype=np.float32)
    out: dict[str, float] = {}
    tx, th, tu, td, ts = (torch.from_numpy(a) for a in (x, h, w_up, w_down, w_sq))

    def blas() -> None:
        torch.nn.functional.linear(tx, tu)
        torch.nn.functional.linear(th, td)
        for _ in range(4):
            torch.nn.functional.linear(tx, ts)

    def onednn() -> None:
        lin = torch.ops.mkldnn._linear_pointwise
        lin(tx, tu, None, "none", [None], "")
        lin(th, td, None, "none", [None], "")
        for _ in range(4):
            lin(tx, ts, None, "none", [None], "")

    with torch.inference_mode():
        out["torch BLAS"] = flops / _best_seconds(blas)
        with contextlib.suppress(Exception):  # not every build has oneDNN
            out["oneDNN"] = flops / _best_seconds(onednn)
    with contextlib.suppress(ImportError):
        out["ONNX Runtime"] = flops / _best_seconds(_ort_matmuls(x, h, w_up, w_down, w_sq))
    return out


def _ort_matmuls(x: np.ndarray, h: np.ndarray, w_up: np.ndarray, w_down: np.ndarray,
                 w_sq: np.ndarray) -> Callable[[], object]:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    # four copies of the square weight under four names: graph optimisation would merge
    # four identical products of one weight into one
    named = [(w_up, "w_up"), (w_down, "w_down")] + [(w_sq, f"w_sq{i}") for i in range(4)]
    inits = [numpy_helper.from_array(np.ascontiguousarray(w.T), name) for w, name in named]
    nodes = [helper.make_node("MatMul", ["x", "w_up"], ["up"]),
             helper.make_node("MatMul", ["h", "w_down"], ["down"])]
    nodes += [helper.make_node("MatMul", ["x", f"w_sq{i}"], [f"sq{i}"]) for i in range(4)]
    outs = ["up", "down"] + [f"sq{i}" for i in range(4)]
    graph = helper.make_graph(
        nodes, "one_layer_matmuls",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape)),
         helper.make_tensor_value_info("h", TensorProto.FLOAT, list(h.shape))],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with tempfile.NamedTemporaryFile(suffix=".onnx", delete=False) as f:
        onnx.save(model, f.name)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = torch.get_num_threads()
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as the engine runs it
    sess = ort.InferenceSession(f.name, opts, providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, {"x": x, "h": h})
