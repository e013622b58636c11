"""Where the test suite's real data lives: tests/data/, inside the repository.

One constant, so that every test reads the copy that ships with a clone (a
user's clone has nothing beside it: no ``../shared``). tests/data/README.md
says what each file holds, its source and licence, and tests/data/cut.py how
it was cut from the full data sets.
"""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
SST2 = DATA / "sst2"
AGNEWS = DATA / "agnews"
CONLL2003 = DATA / "conll2003"
