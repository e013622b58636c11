"""A real PostgreSQL server for the tests: Debian's `postgresql` binaries, started
once per test session in a temporary directory, as the `postgres` user (the
server refuses to run as root, and CI runs as root).

Each test that asks for it gets a schema of its own in one database (``CREATE
SCHEMA`` is instant where ``CREATE DATABASE`` copies a template), named in the
URL's ``options`` so every process the test starts (servers, workers, probe
pools) lands in it through ``LAYERBANK_CATALOG_URL``.

The server runs with ``fsync=off``: durability across a power cut (an OS
crash) is PostgreSQL's business, not what these tests check, and a loaded
2-core machine would otherwise spend its time in fsync. Commits stay
synchronous, so a killed server (``stop_keeping_data``) loses no commit.

Example::

    server = PostgresServer.start(tmp_dir)
    url = server.new_schema_url("t_abc")   # postgresql://postgres@127.0.0.1:PORT/layerbank?options=...
    server.stop()
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import uuid
from pathlib import Path
from urllib.parse import quote

__all__ = ["PostgresServer", "find_bin_dir"]

DATABASE = "layerbank"


def find_bin_dir() -> Path | None:
    """Debian's versioned binary directory (``/usr/lib/postgresql/15/bin``), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    def __init__(self, root: Path, port: int, bin_dir: Path, as_user: list[str]) -> None:
        self.root, self.port, self.bin_dir, self._as_user = root, port, bin_dir, as_user

    @property
    def base_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{DATABASE}"

    def _run(self, *cmd: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self._as_user, *cmd], capture_output=True, text=True, timeout=timeout,
                              check=True)

    @classmethod
    def start(cls, root: Path) -> PostgresServer:
        bin_dir = find_bin_dir()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL is not installed (Debian: apt-get install postgresql; "
                               "scripts/test.sh does it)")
        root.mkdir(parents=True, exist_ok=True)
        as_user: list[str] = []
        if os.geteuid() == 0:  # postgres refuses root: run it as the package's own user
            pw = pwd.getpwnam("postgres")
            os.chown(root, pw.pw_uid, pw.pw_gid)
            as_user = ["runuser", "-u", "postgres", "--"]
        server = cls(root, _free_port(), bin_dir, as_user)
        data = root / "data"
        server._run(str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                    "--encoding=UTF8", "--no-sync")
        server.restart()
        server.psql(f"CREATE DATABASE {DATABASE}", database="postgres")
        return server

    def restart(self) -> None:
        """Start the server (again, after ``stop_keeping_data``) and wait until it accepts connections."""
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c full_page_writes=off -c max_connections=400")
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.root / "data"), "-o", opts, "-l",
                  str(self.root / "log"), "-w", "-t", "120", "start", timeout=150)

    def stop_keeping_data(self) -> None:
        """Stop the server now (as a crash would), keeping its data for ``restart``."""
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate",
                  "-w", "stop", timeout=60)

    def psql(self, sql: str, database: str = DATABASE) -> str:
        return self._run(str(self.bin_dir / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U",
                         "postgres", "-d", database, "-v", "ON_ERROR_STOP=1", "-Atc", sql).stdout

    def new_schema_url(self, name: str | None = None) -> str:
        """A fresh, empty schema and the URL whose connections use it."""
        name = name or "t_" + uuid.uuid4().hex[:12]
        self.psql(f"CREATE SCHEMA {name}")
        return f"{self.base_url}?options={quote(f'-csearch_path={name}')}"

    def stop(self) -> None:
        try:
            self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate",
                      "-w", "stop", timeout=60)
        except (subprocess.SubprocessError, OSError):
            pass
        shutil.rmtree(self.root, ignore_errors=True)

