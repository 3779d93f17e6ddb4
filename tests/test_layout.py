"""The architecture holds: imports run one way (protocol <- config <- train <- swarm <- status <- sim <- bench <- cli),
no module imports a higher layer, the module graph has no cycles, and the README's architecture section
names every module that exists."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a module may import its own layer and the layers before it, never one after it
LAYERS = ["gradnode.protocol", "gradnode.node.config", "gradnode.node.train", "gradnode.node.swarm", "gradnode.node.status",
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


def test_architecture_section_names_every_module() -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Architecture"):]
    section = section[:section.index("\n## ", 1)]
    missing = [str(p.relative_to(ROOT)) for name, p in modules().items()
               if p.name != "__init__.py" and str(p.relative_to(ROOT)) not in section]
    assert not missing, f"README's architecture section does not name: {missing}"
    for path in [w.strip("`") for w in section.split() if w.strip("`,.;:()").endswith(".py")]:
        path = path.strip("`,.;:()")
        if "/" in path:
            assert (ROOT / path).is_file(), f"README's architecture section names {path}, which does not exist"


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
