"""The architecture holds: imports run one way (protocol <- config <- train <- swarm <- status <- sim <- bench <- cli),
no module imports a higher layer, the module graph has no cycles, and the README's architecture section
names every module that exists."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a module may import its own layer and the layers before it, never one after it
LAYERS = ["gradnode.protocol", "gradnode.node.config", "gradnode.node.shutdown", "gradnode.node.train", "gradnode.node.swarm", "gradnode.node.status",
          "gradnode.node.sim", "gradnode.node.bench", "gradnode.node.cli"]


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in (("protocol", "gradnode.protocol"), ("node", "gradnode.node")):
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


def imports_of(path: Path) -> set[str]:
    """Every gradnode module ``path`` imports, at module level or inside functions."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("gradnode")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gradnode"):
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def layer(module: str) -> int:
    for i, prefix in reversed(list(enumerate(LAYERS))):
        if module == prefix or module.startswith(prefix + "."):
            return i
    assert module in ("gradnode.node",), f"{module} belongs to no layer: add it to LAYERS"
    return 0


def test_imports_run_one_way() -> None:
    mods = modules()
    wrong = []
    for name, path in mods.items():
        for target in imports_of(path):
            if target in mods and layer(target) > layer(name):
                wrong.append(f"{name} imports {target}")
    assert not wrong, "imports against the layering:\n" + "\n".join(sorted(wrong))


def test_no_import_cycles() -> None:
    mods = modules()
    graph = {name: {t for t in imports_of(path) if t in mods and t != name} for name, path in mods.items()}
    state: dict[str, int] = {}

    def visit(n: str, trail: list[str]) -> None:
        state[n] = 1
        for m in graph[n]:
            if state.get(m) == 1:
                raise AssertionError("import cycle: " + " -> ".join(trail[trail.index(m):] + [n, m]))
            if m not in state:
                visit(m, trail + [n])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [])


def test_the_architecture_page_names_every_module() -> None:
    """docs/architecture.md names every module that exists, and only modules that exist (the README does not)."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    missing = [str(p.relative_to(ROOT)) for name, p in modules().items()
               if p.name != "__init__.py" and f"`{p.relative_to(ROOT)}`" not in page]
    assert not missing, f"docs/architecture.md does not name: {missing}"
    for path in re.findall(r"`((?:node|protocol)/[\w/]+\.(?:py|c))`", page):
        assert (ROOT / path).is_file(), f"docs/architecture.md names {path}, which does not exist"


def test_no_document_outside_the_notes_speaks_of_work_sessions_or_issues() -> None:
    """Documents speak of the project only: its measured history lives in docs/notes/."""
    pattern = re.compile(r"\b(?:stops?|[Ii]ssues?) [0-9]+")
    docs = [p for p in ROOT.rglob("*.md") if ".venv" not in p.parts and "notes" not in p.relative_to(ROOT).parts[:2]
            and not p.relative_to(ROOT).parts[0].startswith(".")]
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in docs for m in pattern.finditer(p.read_text())]
    assert docs and not found, found


def test_no_code_speaks_of_work_sessions_or_issues() -> None:
    """Comments and docstrings state a rule, its figures and how they were measured, never the work session
    that measured them."""
    pattern = re.compile(r"\b(?:stops?|[Ii]ssues?) [0-9]+")
    files = [p for folder in ("node", "protocol", "tests", "scripts", "configs") for p in (ROOT / folder).rglob("*")
             if p.suffix in (".py", ".yaml", ".yml", ".toml", ".sh", ".html")]
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in files for m in pattern.finditer(p.read_text())]
    assert files and not found, found


def test_the_code_that_decides_a_round_reads_no_clock_and_does_no_io() -> None:
    """The round's rules (protocol/round.py, sync.py, chain.py, witness.py) are pure: events with their time in,
    actions out. They import no clock, thread, socket, file, randomness or network module, at module level
    or inside a function; the shells in node/ own all of that."""
    io = {"time", "threading", "asyncio", "socket", "os", "random", "subprocess", "pathlib", "io", "select",
          "hivemind", "torch", "logging"}
    found = []
    for name in ("round", "sync", "chain", "witness"):
        for node in ast.walk(ast.parse((ROOT / "protocol" / f"{name}.py").read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"protocol/{name}.py imports {n}" for n in names if n.split(".")[0] in io]
    assert not found, found


def test_the_glossary_defines_the_projects_own_words() -> None:
    """Every private word the docs and the code lean on has a line in docs/glossary.md."""
    rows = re.findall(r"^\| ([^|]+?) \|", (ROOT / "docs" / "glossary.md").read_text(), re.M)
    defined = {w.strip() for row in rows for w in row.split(",")}
    words = ("witness", "tail", "chain", "look", "level", "chores", "settle", "adopt", "abstain", "base", "cut time",
             "stop", "seed", "re-sync", "linger", "voters", "contributors ledger", "state offer", "violation")
    assert not [w for w in words if w not in defined], [w for w in words if w not in defined]


def test_the_docs_read_in_short_sentences(capsys) -> None:
    """README.md at most 3,000 words, every page outside docs/notes/ at most 2,000; no sentence over 40 words and
    no table cell over 25 (scripts/prose_stats.py, the counter the bounds were set with)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("prose_stats", ROOT / "scripts" / "prose_stats.py")
    prose = importlib.util.module_from_spec(spec)
    sys.modules["prose_stats"] = prose  # dataclasses look their module up while the module runs
    spec.loader.exec_module(prose)
    pages = [p for p in sorted((ROOT / "docs").rglob("*.md")) if "notes" not in p.parts]
    pages += [ROOT / "docker" / "README.md", ROOT / "protocol" / "WIRE.md"]
    assert prose.main(["--max-words", "3000", "--max-sentence", "40", "--max-cell", "25", str(ROOT / "README.md")]) == 0, \
        capsys.readouterr().out
    assert prose.main(["--max-words", "2000", "--max-sentence", "40", "--max-cell", "25", *map(str, pages)]) == 0, \
        capsys.readouterr().out
