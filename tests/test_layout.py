"""The house keeps its shape: no import circle inside tpunb, few modules at the top level, results
and their rendering never pulled into the engine, and the modules shipped to hosts import nothing
but the standard library and each other."""
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
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if not p.name.startswith("__"))  # __main__: `python -m tpunb`
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
    from tpunb.host.bundle import MODULES

    shipped = {f"{name}.py" for name in MODULES} | {"service.py"}  # service.py: the service control program
    readers = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
               if "/stat" in p.read_text() and "/proc" in p.read_text()
               and not (p.parent.name == "host" and p.name in shipped)]
    assert readers == ["host/procs.py"], readers


#: the only places a test may pause for a fixed time, and why each is not standing in for a condition
SLEEP_ALLOWED = {
    ("conftest.py", "wait_for"): "the poll interval of a wait on a real condition",
    ("test_emulator.py", "states_until"): "polls fast enough to see every state an operation passes through",
    ("test_liveness.py", "press"): "the gap between a user's repeated Ctrl-C presses is the behaviour under test",
}


def _pauses(tree: ast.AST) -> list[tuple[str, int]]:
    """(innermost function, line) of each fixed pause: time.sleep(...), sleep(...), or a wait on a
    fresh Event."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        elif isinstance(node, ast.Call):
            func = node.func
            sleep = (isinstance(func, ast.Attribute) and func.attr == "sleep") or \
                (isinstance(func, ast.Name) and func.id == "sleep")
            fresh_event_wait = isinstance(func, ast.Attribute) and func.attr == "wait" and \
                isinstance(func.value, ast.Call) and ast.unparse(func.value.func).endswith("Event")
            if sleep or fresh_event_wait:
                found.append((function, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    return found


def test_tests_wait_on_conditions_not_on_the_clock():
    """A sleep in a test body is a guess about timing that a loaded machine proves wrong: wait on the
    condition itself (conftest.wait_for, an Event, a file). Sleeps inside the cells a test sends to its
    hosts are workloads, not waits, and are strings here. Allowed: SLEEP_ALLOWED, each with its reason."""
    tests = Path(__file__).resolve().parent
    offenders = []
    for path in sorted(tests.rglob("*.py")):
        for function, line in _pauses(ast.parse(path.read_text())):
            if (path.name, function) not in SLEEP_ALLOWED:
                offenders.append(f"{path.relative_to(tests)}:{line} in {function}")
    assert not offenders, "fixed pauses in tests (wait on a condition instead): " + ", ".join(offenders)
    seen = {(p.name, f) for p in tests.rglob("*.py") for f, _ in _pauses(ast.parse(p.read_text()))}
    assert seen >= set(SLEEP_ALLOWED), f"allow-list entries no longer needed: {set(SLEEP_ALLOWED) - seen}"


#: the engine: the session, its parts and the transports under them
ENGINE = ("tpunb.session", "tpunb.engine", "tpunb.transport")
#: records and their rendering, which the engine hands results to and must not be pulled into
RECORDS = ("tpunb.results", "tpunb.display")


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def engine_reached_from_records(edges: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each record module that reaches the engine, with the import path that does it."""
    found = {}
    for start in sorted(m for m in edges if _within(m, RECORDS)):
        paths, queue = {start: [start]}, [start]
        while queue:
            node = queue.pop(0)
            if _within(node, ENGINE):
                found[start] = paths[node]
                break
            for nxt in sorted(edges.get(node, ())):
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    queue.append(nxt)
    return found


def test_records_and_display_never_import_the_engine():
    reached = engine_reached_from_records(graph())
    assert not reached, "; ".join(" -> ".join(path) for path in reached.values())


def test_the_check_sees_the_engine_reached_through_another_module():
    edges = {"tpunb.results": {"tpunb.display.hosts"}, "tpunb.display.hosts": {"tpunb.errors"},
             "tpunb.display.sink": set(), "tpunb.errors": {"tpunb.engine.connection"},
             "tpunb.engine.connection": {"tpunb.transport.base"}, "tpunb.transport.base": set()}
    reached = engine_reached_from_records(edges)
    assert reached == {"tpunb.results": ["tpunb.results", "tpunb.display.hosts", "tpunb.errors", "tpunb.engine.connection"],
                       "tpunb.display.hosts": ["tpunb.display.hosts", "tpunb.errors", "tpunb.engine.connection"]}
