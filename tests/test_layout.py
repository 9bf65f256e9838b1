"""The house keeps its shape: no import circle inside tpunb, few modules at the top level, and
the modules shipped to hosts import nothing but the standard library and each other."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "tpunb"
MAX_TOP_LEVEL_MODULES = 13  # besides __init__.py; units.py (issue 23: one duration and byte formatter) made 13


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """tpunb modules this one imports, at module level or inside functions (not TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = walk(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            cycle = walk(node)
            if cycle:
                return cycle
    return None


def test_no_import_circle_inside_tpunb():
    cycle = find_cycle(graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_check_sees_a_circle_when_there_is_one():
    edges = graph()
    edges["tpunb.errors"] = edges["tpunb.errors"] | {"tpunb.slices"}  # slices -> ... -> errors
    assert find_cycle(edges) is not None


def test_at_most_twelve_modules_at_the_top_level():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} top-level modules: {top}"


def test_host_modules_import_only_the_standard_library_and_each_other():
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    for path in (PACKAGE / "host").glob("*.py"):
        if path.name == "bundle.py":  # runs in the kernel, never shipped
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level: functions may use IPython/jax when the host has them
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [] if node.level else [node.module or ""]
            else:
                continue
            for imported in names:
                assert imported.split(".")[0] in allowed, f"{path.name} imports {imported} at module level"


def test_magics_speak_only_through_the_reporter():
    """Every message of the magics goes one way (tpunb.report), so captured() sees them all."""
    tree = ast.parse((PACKAGE / "magics.py").read_text())
    prints = [node.lineno for node in ast.walk(tree)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"]
    assert not prints, f"tpunb/magics.py calls print() on lines {prints}: use report.info or report.warn"


def test_process_state_is_read_in_one_place():
    """/proc/PID/stat has one reader outside the shipped host modules: tpunb/host/procs.py (one
    zombie rule). The shipped host modules keep their own: they may import nothing of tpunb."""
    shipped = {"watchdog.py", "idle.py", "metrics.py", "agent.py", "io.py", "runners.py", "diagnose.py"}
    readers = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
               if "/stat" in p.read_text() and "/proc" in p.read_text()
               and not (p.parent.name == "host" and p.name in shipped)]
    assert readers == ["host/procs.py"], readers
