"""What the lab's pages cost the API's hot paths: the pass-through of
``LabPages`` (app/api/lab/pages.py) on a ``POST /v1/features`` request.

The lab answers its own paths in an ASGI middleware placed before the key
guard; every other request pays one method check and one prefix test there.
This measures that cost in-process (no network, no server: a stand-in app
that does nothing), so the figure does not move with the machine's load, and
prints it against the cached ``/v1/features`` p50 of README's serving table.

    .venv/bin/python bench/lab_overhead.py            # ~5 s
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from layerbank.app.api.lab import LabPages

CACHED_P50_MS = 1.67  # README, "Serving": cached POST /v1/features, 1 text, concurrency 1


async def _inner(scope: Any, receive: Any, send: Any) -> None:
    return None


async def _time(app: Any, scope: dict[str, Any], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await app(scope, None, None)
    return (time.perf_counter() - start) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200_000, help="calls per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    scope = {"type": "http", "method": "POST", "path": "/v1/features", "headers": []}
    get_scope = {**scope, "method": "GET", "path": "/v1/datasets/ds_0/features"}
    lab = LabPages(_inner)
    bare, post, get = [], [], []
    for _ in range(args.rounds):  # alternate, best of each: the machine is shared
        bare.append(asyncio.run(_time(_inner, scope, args.n)))
        post.append(asyncio.run(_time(lab, scope, args.n)))
        get.append(asyncio.run(_time(lab, get_scope, args.n)))
    extra_post = (min(post) - min(bare)) * 1e9
    extra_get = (min(get) - min(bare)) * 1e9
    print(f"LabPages pass-through, POST /v1/features: +{extra_post:.0f} ns per request "
          f"({extra_post / (CACHED_P50_MS * 1e6):.5%} of the cached p50 {CACHED_P50_MS} ms)")
    print(f"LabPages pass-through, GET /v1/datasets/.../features: +{extra_get:.0f} ns per request "
          f"({extra_get / (CACHED_P50_MS * 1e6):.5%} of the cached p50)")


if __name__ == "__main__":
    main()
