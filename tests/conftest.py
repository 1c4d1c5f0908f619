"""Shared fixtures: a headless Debian Chromium for the pages the project serves or writes, and a
throwaway PostgreSQL server for the tests that need a database server."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ports import free_port

# Run in the background from a script (`nohup make test &`), this process starts with SIGINT
# ignored, and so would every process a test starts; the tests send Ctrl-C to some of them.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# One thread per process: `make test` runs two test files at once on 2 cores, and every run a test
# starts is tiny. Left to their defaults, two tests' runs each took both cores and spun against each
# other (OpenMP): two tiny Table 3 sittings side by side took 131 s each, 31 s each on one thread.
# The sweep launcher takes this as the cap of each worker's share (`sweeps.launch.thread_cap`).
os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")


def measurements(kind: str) -> list[Path]:
    """Every benchmarks/results/KIND-*/results.json, oldest first (its folders are dated)."""
    return sorted((Path(__file__).resolve().parent.parent / "benchmarks" / "results").glob(f"{kind}-*/results.json"))


def newest_measurement(kind: str) -> tuple[Path, dict] | None:
    """The newest of `measurements(kind)` and its figures; None when there is none."""
    measured = measurements(kind)
    return (measured[-1], json.loads(measured[-1].read_text())) if measured else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest test files first. `make test` hands whole files to its two processes in the order
    they are collected (`--dist loadfile --no-loadscope-reorder`): a long file handed out last runs
    on alone while the other process has nothing left (test_table3, the longest, comes late in the
    alphabet). Each file's seconds are those of the newest committed measurement of the suite
    (`newest_measurement("test-suite-cpu")`); a file it lacks goes after those it has, and a file's
    tests keep their order."""
    try:
        found = newest_measurement("test-suite-cpu")
        seconds = found[1]["files"] if found else {}
    except (OSError, ValueError, KeyError):  # a damaged measurement orders nothing; test_docs says so
        seconds = {}
    items.sort(key=lambda item: -float(seconds.get(item.path.stem, 0.0)))


@contextlib.contextmanager
def start_chromium(profile: Path) -> Iterator[object]:
    """Headless Debian Chromium through Debian's chromedriver, its profile in `profile` (the test is
    skipped when either is missing); quit on leaving."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    for exe in (CHROMIUM, CHROMEDRIVER):
        if not os.access(exe, os.X_OK):
            pytest.skip(f"{exe} not installed (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1400,1000", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    """A Chromium of the test's own (`start_chromium`)."""
    with start_chromium(tmp_path / "chromium-profile") as driver:
        yield driver


@pytest.fixture
def traced_graphs() -> Iterator[tuple[object, list]]:
    """`(backend, graphs)`: a torch.compile backend that keeps each FX graph AOTAutograd traces
    (the forward graph, then the backward graph, in `graphs`) and runs it as it is; torch.compile's
    caches are reset before and after, so the graphs are this test's own."""
    import torch
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs: list = []

    def keep(graph, example_inputs):
        graphs.append(graph)
        return make_boxed_func(graph.forward)

    torch.compiler.reset()
    yield aot_autograd(fw_compiler=keep, bw_compiler=keep), graphs
    torch.compiler.reset()


SKIP = "PostgreSQL server not installed (apt-get install postgresql)"


def _pg_bindir() -> Path | None:
    """The newest Debian PostgreSQL bin directory holding initdb and pg_ctl, else one on PATH."""
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(Path(d).parent.name)
                  if Path(d).parent.name.isdigit() else 0)
    for d in reversed(dirs):
        if os.access(Path(d) / "initdb", os.X_OK) and os.access(Path(d) / "pg_ctl", os.X_OK):
            return Path(d)
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl and Path(initdb).resolve().parent == Path(pg_ctl).resolve().parent:
        return Path(initdb).resolve().parent
    return None




@pytest.fixture(scope="session")
def postgres_url():
    """A PostgreSQL server for this test session: yields its SQLAlchemy URL; stopped and removed after."""
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip(SKIP)
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        pytest.skip("psycopg2 not importable (pip install psycopg2-binary)")

    base = Path(tempfile.mkdtemp(prefix="ablate-pg-"))
    as_root = os.geteuid() == 0
    prefix: list[str] = []
    if as_root:  # PostgreSQL refuses to run as root: the Debian package's `postgres` user runs it
        shutil.chown(base, "postgres", "postgres")
        prefix = ["runuser", "-u", "postgres", "--"]
    data, log = base / "data", base / "server.log"
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}

    def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        # cwd=base: the postgres user may not be allowed into the test's working directory
        result = subprocess.run([*prefix, *cmd], cwd=base, env=env, capture_output=True, text=True,
                                timeout=120)
        if check and result.returncode != 0:
            server_log = log.read_text() if log.exists() else "(no server log)"
            pytest.fail(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}\n"
                        f"--- server log ---\n{server_log}", pytrace=False)
        return result

    started = False
    try:
        run(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8",
            "--no-locale", "--no-sync")
        for attempt in range(3):  # the free port may be taken between probing and binding
            port = free_port()
            result = run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60",
                         "-o", f"-h 127.0.0.1 -p {port} -k {base} -c fsync=off", "start", check=False)
            if result.returncode == 0:
                break
            if attempt == 2 or not log.exists() or "already in use" not in log.read_text():
                pytest.fail(f"pg_ctl start failed ({result.returncode}):\n{result.stdout}\n{result.stderr}\n"
                            f"--- server log ---\n{log.read_text() if log.exists() else '(none)'}",
                            pytrace=False)
        started = True
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
    finally:
        if started:
            run(str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop", check=False)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """A 3,000-pair slice of Ding's train split and 100 dev pairs as files, and the `ablate`
    options that train on them (`--data files` skips extracting the whole dictionary per run). The
    sentences come through the runs' own extraction cache (each test process would otherwise parse
    the dictionary again, ~8 s of CPU; the tests of the extraction itself are test_data.py's)."""
    from lightning_modules.config import DataConfig
    from lightning_modules.data.ding import extract_ding_cached, split_ding

    config = DataConfig()
    sentences, _ = extract_ding_cached(config.ding_path, config.cache_dir, phrases=False)
    train, valid, _ = split_ding(sentences, 100, 100)
    out, args = tmp_path_factory.mktemp("corpus"), []
    for split, pairs in (("train", train[:3000]), ("valid", valid)):
        for side, (lang, flag) in enumerate((("en", "src"), ("de", "tgt"))):
            path = out / f"{split}.{lang}"
            path.write_text("".join(pair[side] + "\n" for pair in pairs), encoding="utf-8")
            args += [f"--{split}-{flag}", str(path)]
    return args
