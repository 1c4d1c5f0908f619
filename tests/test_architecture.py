"""The packages' layering: imports run one way only, without cycles, and the light entry points stay
light.

    ablate -> tables -> reports -> sweeps -> ablations -> lightning_modules -> foundation   (benchmarks -> sweeps)

Every import statement of the installed packages counts, those inside functions too (a lazy import
is still a dependency).
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

# Each package may import the packages after it in this order, never one before it.
ORDER = ("ablate", "tables", "reports", "sweeps", "ablations", "lightning_modules", "foundation")
# benchmarks: a top-level consumer like ablate; the workers benchmark runs the sweep launcher's split
ALLOWED = {pkg: set(ORDER[i + 1:]) for i, pkg in enumerate(ORDER)} | {"benchmarks": set(ORDER[3:])}
PACKAGES = tuple(ALLOWED)


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, f"{name} is not an installed package"
    return Path(next(iter(spec.submodule_search_locations)))


def modules() -> dict[str, Path]:
    """Every module of the packages by dotted name (benchmark result scripts left out)."""
    found = {}
    for pkg in PACKAGES:
        root = package_dir(pkg)
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root.parent).with_suffix("")
            if "results" in rel.parts[:-1]:  # a dated result's scripts (run/results.py is a module)
                continue
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The first-party modules `name` imports (`from pkg import sub` counts as pkg.sub)."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + is_package]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        out.update(t for t in targets if t in known and t != name)
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def test_every_package_is_found():
    names = set(modules())
    assert {"ablate.cli", "tables.make", "reports.build", "sweeps.worker", "ablations.spec", "lightning_modules.config",
            "lightning_modules.run.train"} <= names


def test_dated_results_scripts_are_no_part_of_a_package():
    """A dated result's scripts live beside it (benchmarks/results/*/, reports/results/*/) and run as
    files: no folder there is a package, and the installed packages name none of them."""
    root = Path(__file__).resolve().parent.parent
    inits = [str(p.relative_to(root)) for folder in ("benchmarks/results", "reports/results")
             for p in (root / folder).rglob("__init__.py")]
    assert not inits, f"a results folder made a package: {inits}"
    installed = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"]
    assert not [p for p in installed if "results" in p.split(".") or p.split(".")[0] == "benchmarks"], installed


def test_imports_run_one_way_only():
    wrong = sorted(f"{a} imports {b}" for a, targets in graph().items() for b in targets
                   if b.split(".")[0] != a.split(".")[0]
                   and b.split(".")[0] not in ALLOWED[a.split(".")[0]])
    assert not wrong, "imports against ablate -> tables -> reports -> sweeps -> ablations -> lightning_modules -> foundation:\n" \
        + "\n".join(wrong)


def strongly_connected(g: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module (the import cycles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycles():
    g = graph()
    # A package's __init__ importing its own modules is not a cycle of the design: leave it out.
    g = {a: {b for b in targets if not a.startswith(b + ".")} for a, targets in g.items()}
    assert strongly_connected(g) == []


def test_cycle_finder_finds_a_cycle():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("module", ["ablate.cli", "ablate", "reports", "sweeps", "ablations",
                                    "lightning_modules", "lightning_modules.data", "lightning_modules.run",
                                    "foundation.errors", "ablations.resolve", "sweeps.worker",
                                    "sweeps.wandb_entry", "sweeps.trial_run", "reports.build"])
def test_light_modules_load_no_torch(module):
    code = (f"import sys, {module}; heavy = [m for m in ('torch', 'lightning') if m in sys.modules]; "
            f"print(','.join(heavy))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"importing {module} loads {result.stdout.strip()}"


def test_ablate_help_loads_no_torch():
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "ablate", "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "usage: ablate" in result.stdout
    loaded = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line]
    assert not [m for m in loaded if m.split(".")[0] in ("torch", "lightning")]


def test_ablate_version_names_the_installed_package_and_loads_no_torch():
    from importlib.metadata import version

    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "ablate", "--version"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == f"ablate {version('transformer-ablations')}"
    loaded = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line]
    assert not [m for m in loaded if m.split(".")[0] in ("torch", "lightning")]


def test_the_checks_before_a_table_or_sweep_is_queued_load_no_lightning(tmp_path):
    """The parent process of `ablate table3` / `ablate sweep optuna` plans, checks the hardware and
    prepares the data (corpus, BPE, length filter) before queueing: all without Lightning (3 s of
    start-up each time; the trials load it) and without pandas (half a second; the report loads it)."""
    code = (
        "import sys\n"
        "from tables.plan import check_data, make_plan, queue\n"
        f"plan = make_plan('tiny', 'sqlite:///{tmp_path}/t.db', '{tmp_path}/runs', ['data.vocab_size=500', "
        "'data.valid_size=100'], rows='base,E', seeds='1')\n"
        "check_data(plan)\n"
        "queue(plan)\n"
        "print(','.join(m for m in ('lightning', 'pytorch_lightning', 'pandas') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "", f"loaded {result.stdout.strip()}"
    assert (tmp_path / "t.db").is_file()  # it did queue
