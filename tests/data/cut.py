"""Cut the test suite's data (tests/data/) from the full public data sets.

The tests read real labelled text, and a clone of the repository must be
enough to run them, so the small part of each data set they need ships here.
This script is how those files were made; re-running it on the same sources
writes the same bytes (every draw is seeded, rows keep their source order).

    python tests/data/cut.py [SOURCE [OUT]]

SOURCE is the folder laid out as the development machines' ``../shared/data``
(``sst2/``, ``agnews/``, ``conll2003/``; the default), OUT is this folder.
What each file holds, and why that much, is in tests/data/README.md.
"""

from __future__ import annotations

import hashlib
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_SOURCE = HERE.parents[2] / "shared" / "data"

SST2_TRAIN_ROWS = 16_000  # >= 11,200 distinct 3+-word phrases: tests/reliability/conftest.py's offsets
AGNEWS_PER_LABEL = 250
CONLL_TRAIN_SENTENCES = 1_000  # the NER tests take the first 800 at most


def _lines(path: Path) -> list[bytes]:
    """The file's lines, each with its newline: bytes, so nothing is re-encoded."""
    return path.read_bytes().splitlines(keepends=True)


def copy_whole(src: Path) -> bytes:
    return src.read_bytes()


def sample_rows(src: Path, n: int, seed: int, header: bool) -> bytes:
    """``n`` rows drawn with ``random.Random(seed)``, in the order the source has them."""
    lines = _lines(src)
    head, rows = (lines[:1], lines[1:]) if header else ([], lines)
    keep = sorted(random.Random(seed).sample(range(len(rows)), n))
    return b"".join(head + [rows[i] for i in keep])


def sample_per_label(src: Path, per_label: int, seed: int) -> bytes:
    """``per_label`` rows of each label (the last tab-separated field), source order kept."""
    rows = _lines(src)
    by_label: dict[bytes, list[int]] = {}
    for i, row in enumerate(rows):
        by_label.setdefault(row.rstrip(b"\r\n").rsplit(b"\t", 1)[1], []).append(i)
    rng = random.Random(seed)
    keep = sorted(i for label in sorted(by_label) for i in rng.sample(by_label[label], per_label))
    return b"".join(rows[i] for i in keep)


def first_sentences(src: Path, n: int) -> bytes:
    """The first ``n`` blank-line separated sentences, each with the blank line after it."""
    out: list[bytes] = []
    done = 0
    for line in _lines(src):
        out.append(line)
        if not line.strip():
            done += 1
            if done == n:
                break
    return b"".join(out)


def cut(source: Path, out: Path) -> dict[str, bytes]:
    files = {
        "sst2/train.tsv": sample_rows(source / "sst2" / "train.tsv", SST2_TRAIN_ROWS, seed=0, header=True),
        "sst2/dev.tsv": copy_whole(source / "sst2" / "dev.tsv"),
        "sst2/test.tsv": copy_whole(source / "sst2" / "test.tsv"),
        "agnews/dev.tsv": sample_per_label(source / "agnews" / "dev.tsv", AGNEWS_PER_LABEL, seed=0),
        "conll2003/train.txt": first_sentences(source / "conll2003" / "train.txt", CONLL_TRAIN_SENTENCES),
        "conll2003/valid.txt": copy_whole(source / "conll2003" / "valid.txt"),
    }
    for name, data in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    return files


def main(argv: list[str]) -> int:
    source = Path(argv[0]) if argv else DEFAULT_SOURCE
    out = Path(argv[1]) if len(argv) > 1 else HERE
    if not (source / "sst2" / "train.tsv").is_file():
        print(f"cut.py: no data sets at {source} (expected sst2/, agnews/, conll2003/ there)", file=sys.stderr)
        return 2
    for name, data in cut(source, out).items():
        lines = data.count(b"\n")
        print(f"{name}\t{lines} lines\t{len(data)} bytes\tsha256 {hashlib.sha256(data).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
