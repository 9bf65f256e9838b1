"""The house keeps its shape: no import circle inside tpunb (every import counted: module level,
inside functions and under TYPE_CHECKING), few modules at the top level, results and their
rendering never pulled into the engine, and the host folder as the boundary of what is shipped:
its modules import nothing but the standard library and each other, never leave it, and are
exactly what the bundle ships, in an order that works."""
from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "tpunb"
MAX_TOP_LEVEL_MODULES = 12  # besides __init__.py
HOST = PACKAGE / "host"
STANDALONE = HOST / "standalone"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> list[Path]:
    """tpunb's modules, less the probes this file's self-tests plant in the package for a moment
    (another worker's scan must not see them)."""
    return sorted(p for p in PACKAGE.rglob("*.py") if not p.name.startswith("_probe_"))


def parsed(path: Path) -> ast.Module:
    """A file's syntax tree, parsed once per version of the file: nearly every rule here walks every
    module, and parsing them again for each took a third of this file's time. Read, never changed."""
    return _parsed(path, path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=None)
def _parsed(path: Path, version: int) -> ast.Module:
    return ast.parse(path.read_text())


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sources()}


def _resolved(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from`` import names (a relative one resolved from ``name``)."""
    if not node.level:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    anchor = package.split(".")
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """tpunb modules this one imports: every import, at module level, inside functions and under
    TYPE_CHECKING alike (a type-only import is still an edge a reader follows)."""
    found: set[str] = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolved(name, path, node)
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in known else base)
    edges = set()
    for module in found:
        while module and module not in known:  # tpunb.x.y.Name -> tpunb.x.y
            module = module.rpartition(".")[0]
        if module and module != name:
            edges.add(module)
    return edges


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
    edges["tpunb.errors"] = edges["tpunb.errors"] | {"tpunb.manager"}  # slices -> ... -> errors
    assert find_cycle(edges) is not None


# -- rooms and layers ------------------------------------------------------------------------------
README = PACKAGE.parent / "README.md"
MAX_UPWARD = 3
ROOM_ROW = re.compile(r"^\| `([\w.]+)` \| (\d+) ([\w ]+?) \|")
UPWARD_ROW = re.compile(r"^\| `(tpunb[\w.]*)` → `(tpunb[\w.]*)` \| (.+?) \|$")


def room(module: str) -> str:
    """A module's room: its package right under tpunb/, or the top-level module itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def room_edges(edges: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """Every import between two rooms, with the module imports that make it."""
    between: dict[tuple[str, str], list[str]] = {}
    for module, targets in edges.items():
        for target in targets:
            if room(module) != room(target):
                between.setdefault((room(module), room(target)), []).append(f"{module} -> {target}")
    return between


def declared_layers(text: str | None = None) -> tuple[dict[str, int], dict[tuple[str, str], str]]:
    """The README's layer table (room, layer; lower first) and its list of imports that go up a
    layer (module → module, why): the only place layers are defined."""
    text = README.read_text() if text is None else text
    layers: dict[str, int] = {}
    upward: dict[tuple[str, str], str] = {}
    for line in text.splitlines():
        if found := ROOM_ROW.match(line):
            name, layer = found.group(1), int(found.group(2))
            assert name not in layers, f"room {name} is in the layer table twice"
            assert not layers or layer >= max(layers.values()), f"the layer table lists lower layers first: {name}"
            layers[name] = layer
        elif found := UPWARD_ROW.match(line):
            upward[(found.group(1), found.group(2))] = found.group(3)
    return layers, upward


def layer_problems(edges: dict[str, set[str]], layers: dict[str, int],
                   upward: dict[tuple[str, str], str]) -> list[str]:
    """Imports that go up a layer without being listed, rooms that import each other, a circle of
    rooms, and rooms the table does not know (or knows but that do not exist)."""
    problems = []
    rooms = {room(m) for m in edges}
    problems += [f"room {r} is not in the README's layer table" for r in sorted(rooms - set(layers))]
    problems += [f"the layer table names {r}, which is not a room" for r in sorted(set(layers) - rooms)]
    between = room_edges(edges)
    for (a, b), why in sorted(between.items()):
        if (b, a) in between and a < b:
            problems.append(f"rooms {a} and {b} import each other: {why[0]}; {between[(b, a)][0]}")
        if a in layers and b in layers and layers[b] > layers[a]:
            problems += [f"{a} (layer {layers[a]}) imports {b} (layer {layers[b]}), up a layer: {edge}"
                         for edge in why if tuple(edge.split(" -> ")) not in upward]
    cycle = find_cycle({a: {b for (x, b) in between if x == a} for a in rooms})
    if cycle:
        problems.append("rooms in a circle: " + " -> ".join(cycle))
    if len(upward) > MAX_UPWARD:
        problems.append(f"{len(upward)} imports listed as going up a layer; at most {MAX_UPWARD}")
    return problems


def test_rooms_sit_in_the_readmes_layers_and_import_only_down():
    layers, upward = declared_layers()
    assert len(layers) >= 30, "the README's layer table was not found"
    problems = layer_problems(graph(), layers, upward)
    assert not problems, "\n".join(problems)


def test_the_layer_check_sees_an_upward_import_a_pair_a_circle_and_an_unknown_room():
    layers, upward = declared_layers()
    edges = {name: set(targets) for name, targets in graph().items()}
    assert not layer_problems(edges, layers, upward)
    up = {k: set(v) for k, v in edges.items()}
    up["tpunb.transport.ssh_hosts"].add("tpunb.manager")  # transport climbs to the manager: up, and a circle
    found = layer_problems(up, layers, upward)
    assert any("imports manager" in p and "up a layer" in p for p in found) and any("circle" in p for p in found)
    pair = {k: set(v) for k, v in edges.items()}
    pair["tpunb.errors"] = {"tpunb.units"}  # units -> errors and errors -> units: one layer, a pair
    found = layer_problems(pair, layers, upward)
    assert any("errors and units import each other" in p for p in found), found
    circle = {k: set(v) for k, v in edges.items()}
    circle["tpunb.errors"] = {"tpunb.plan"}  # plan -> catalog -> errors -> plan: three rooms, no pair
    assert any("rooms in a circle" in p for p in layer_problems(circle, layers, upward))
    unknown = {**edges, "tpunb.newroom": {"tpunb.errors"}}
    assert any("newroom is not in" in p for p in layer_problems(unknown, layers, upward))
    listed = {**upward, ("tpunb.transport.ssh_hosts", "tpunb.manager"): "planted"}
    assert not any("up a layer" in p for p in layer_problems(up, layers, listed))
    many = {(f"tpunb.a{i}", "tpunb.b"): "planted" for i in range(MAX_UPWARD + 1)}
    assert any("at most" in p for p in layer_problems(edges, layers, many))
    table = "| `errors` | 1 base | x |\n| `units` | 1 base | y |\n| `catalog` | 2 records | z |\n"
    assert declared_layers(table)[0] == {"errors": 1, "units": 1, "catalog": 2}
    try:
        declared_layers("| `catalog` | 2 records | z |\n| `errors` | 1 base | x |\n")
    except AssertionError as e:
        assert "lower layers first" in str(e)
    else:
        raise AssertionError("a table out of order was read")


def test_at_most_twelve_modules_at_the_top_level():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if not p.name.startswith("__"))  # __main__: `python -m tpunb`
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} top-level modules: {top}"


def test_the_graph_counts_type_checking_and_function_level_imports(tmp_path):
    known = {"tpunb.a": Path("a.py"), "tpunb.b": Path("b.py"), "tpunb.c": Path("c.py"), "tpunb": Path("__init__.py")}
    probe = tmp_path / "a.py"
    probe.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tpunb.b import Thing\n"
                     "def f():\n    import tpunb.c\n")
    assert imports("tpunb.a", probe, known) == {"tpunb.b", "tpunb.c"}


def test_host_modules_import_only_the_standard_library_and_each_other():
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    for path in HOST.rglob("*.py"):
        tree = parsed(path)
        for node in tree.body:  # module level: functions may use IPython/jax when the host has them
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [] if node.level else [node.module or ""]
            else:
                continue
            for imported in names:
                assert imported.split(".")[0] in allowed, f"{path.name} imports {imported} at module level"
        for node in ast.walk(tree):  # nothing of tpunb anywhere: hosts do not have it
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "tpunb" for a in node.names), f"{path.name}:{node.lineno}"
            elif isinstance(node, ast.ImportFrom) and not node.level:
                assert (node.module or "").split(".")[0] != "tpunb", f"{path.name}:{node.lineno} imports tpunb"


def _relative_imports(path: Path) -> list[ast.ImportFrom]:
    return [n for n in ast.walk(parsed(path)) if isinstance(n, ast.ImportFrom) and n.level]


def test_relative_imports_stay_inside_their_package_and_standalone_programs_have_none():
    """Shipped modules live on hosts as ``tpunb_host``: a relative import that climbs out of the
    host folder names what hosts do not have. A standalone program runs as one file: it has no
    package at all."""
    leaving, standalone = [], []
    for name, path in sorted(modules().items()):
        for node in _relative_imports(path):
            where = f"{path.relative_to(PACKAGE)}:{node.lineno}"
            if path.parent == STANDALONE and path.name != "__init__.py":
                standalone.append(where)
            top = "tpunb.host" if _within(name, ("tpunb.host",)) else name.rpartition(".")[0]
            if not _within(_resolved(name, path, node), (top,)):
                leaving.append(where)
    assert not leaving, f"relative imports that leave their package: {leaving}"
    assert not standalone, f"relative imports in standalone programs: {standalone}"


def _shipped_imports(module: str) -> set[str]:
    """The modules of tpunb/host (dotted below it, e.g. standalone.idle) that ``module`` imports relatively."""
    path = HOST / f"{module.replace('.', '/')}.py"
    found = set()
    for node in _relative_imports(path):
        base = _resolved("tpunb.host." + module, path, node)[len("tpunb.host."):]
        for alias in node.names:
            target = f"{base}.{alias.name}".lstrip(".")
            found.add(target if (HOST / f"{target.replace('.', '/')}.py").exists() else base)
    return found


def test_the_bundle_ships_the_host_folder_in_an_order_that_imports():
    """Every module of tpunb/host is shipped, and of tpunb/host/standalone exactly those a shipped
    module imports; each after the modules it imports (the bootstrap runs them in order)."""
    from tpunb.transport.bundle import MODULES

    folder = {p.stem for p in HOST.glob("*.py") if p.name != "__init__.py"}
    shipped = set(MODULES)
    assert folder <= shipped, f"host modules not shipped: {sorted(folder - shipped)}"
    wanted = folder | {m for module in folder for m in _shipped_imports(module)}
    assert shipped == wanted, f"shipped but neither in the host folder nor imported by it: {sorted(shipped - wanted)}"
    for at, module in enumerate(MODULES):
        missing = _shipped_imports(module) - set(MODULES[:at])
        assert not missing, f"{module} is shipped before {sorted(missing)}, which it imports"


def test_magics_speak_only_through_the_reporter():
    """Every message of the magics goes one way (tpunb.report), so captured() sees them all."""
    prints = [f"{path.name}:{node.lineno}" for path in sorted((PACKAGE / "magics").glob("*.py"))
              for node in ast.walk(parsed(path))
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"]
    assert len(list((PACKAGE / "magics").glob("*.py"))) >= 6
    assert not prints, f"tpunb/magics/ calls print() at {prints}: use report.info or report.warn"


def test_process_state_is_read_in_one_place():
    """/proc/PID/stat has one reader outside the host folder: tpunb/machine/procs.py (one
    zombie rule). The host modules keep their own: they may import nothing of tpunb."""
    readers = [str(p.relative_to(PACKAGE)) for p in sources()
               if "/stat" in p.read_text() and "/proc" in p.read_text() and HOST not in p.parents]
    assert readers == ["machine/procs.py"], readers


#: the only places a test may pause for a fixed time, and why each is not standing in for a condition
SLEEP_ALLOWED = {
    ("conftest.py", "wait_for"): "the poll interval of a wait on a real condition",
    ("test_emulator.py", "states_until"): "polls fast enough to see every state an operation passes through",
    ("test_liveness.py", "press"): "the gap between a user's repeated Ctrl-C presses is the behaviour under test",
    ("test_fetch_hosts.py", "hold"): "a measurement interval: the kernel must stay within its window for as long as "
                                      "the source needs to send the rest of the file, which no event marks",
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
        for function, line in _pauses(parsed(path)):
            if (path.name, function) not in SLEEP_ALLOWED:
                offenders.append(f"{path.relative_to(tests)}:{line} in {function}")
    assert not offenders, "fixed pauses in tests (wait on a condition instead): " + ", ".join(offenders)
    seen = {(p.name, f) for p in tests.rglob("*.py") for f, _ in _pauses(parsed(p))}
    assert seen >= set(SLEEP_ALLOWED), f"allow-list entries no longer needed: {set(SLEEP_ALLOWED) - seen}"


#: the engine: the session, its parts and the transports under them
ENGINE = ("tpunb.engine.session", "tpunb.engine", "tpunb.transport")
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
             "tpunb.engine.connection": {"tpunb.transport.seam"}, "tpunb.transport.seam": set()}
    reached = engine_reached_from_records(edges)
    assert reached == {"tpunb.results": ["tpunb.results", "tpunb.display.hosts", "tpunb.errors", "tpunb.engine.connection"],
                       "tpunb.display.hosts": ["tpunb.display.hosts", "tpunb.errors", "tpunb.engine.connection"]}


#: kernel code: everything but what ships to hosts and the Cloud TPU emulator (a stand-in for Google)
KERNEL_EXCLUDED = ("host", "sandbox", "emulator", "serve")
#: containers that hold state when bound at module level
MUTABLE_CALLS = {"list", "dict", "set", "defaultdict", "deque", "OrderedDict", "Counter", "WeakKeyDictionary",
                 "WeakValueDictionary", "WeakSet"}
#: the kernel's module-level state, and why each is one: the issue 32 cap is three
STATE_ALLOWED = {
    ("manager.py", "MANAGER"): "the kernel's slices, current slice, --env values, last profile and run: one object",
    ("machine/cache.py", "_cache"): "Google Cloud clients, sessions, credentials, answers that do not change",
    ("report.py", "_once"): "what the kernel said or did once already (report.once)",
}
#: module-level state that is not the kernel's data: what guards one of the three above, what a
#: context carries, what is filled at import and never after, and what the process does once.
#: Each is seen by ``module_state`` and listed here with the state it belongs to.
SUPPORT_ALLOWED = {
    ("machine/cache.py", "_cache_lock"): "guards _cache",
    ("report.py", "_collector"): "a ContextVar: the messages of the capture in progress (report.captured), per context",
    ("diagnose/checks.py", "CHECKS"): "filled at import by @check (the doctor's own checks), never after",
    ("provision/gcp/doctor.py", "CHECKS"): "filled at import by @check (the cloud's checks), never after",
    ("fetch/hub.py", "secret_lookup"): "set once at import by tpunb.manager: where %tpu_fetch finds a --secret token",
    ("provision/warm.py", "_lock"): "guards the warm-up's one start per process",
    ("provision/warm.py", "_started"): "the warm-up thread started: once per process",
    ("provision/warm.py", "_compute_started"): "Compute Engine's client imported: once per process",
    ("provision/warm.py", "IMPORTED"): "one event per launch module, set once it is imported: once per process",
    ("provision/interrupts.py", "_dropped"): "a Ctrl-C Python dropped during a launch (set from the signal handler)",
    ("forwards/openssh.py", "_SPAWNER"): "the one thread that forks every ssh ControlMaster (a fork from a thread "
                                      "that holds no lock)",
    ("transport/ssh_hosts.py", "_RECORD_LOCK"): "guards the registry's host keys while two hosts record theirs",
}
#: calls that make state at module level, whatever the name they are bound to
STATE_CALLS = {"ContextVar", "Lock", "RLock", "Event", "Condition", "Semaphore", "BoundedSemaphore",
               "ThreadPoolExecutor", "local"}


@functools.lru_cache(maxsize=1)
def _our_names() -> tuple[frozenset[str], frozenset[str]]:
    """(tpunb's class names, tpunb's _private function names), read once."""
    nodes = [n for p in sources() for n in ast.walk(parsed(p))]
    classes = frozenset(n.name for n in nodes if isinstance(n, ast.ClassDef))
    private = frozenset(n.name for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and n.name.startswith("_") and not n.name.startswith("__")
                        and not re.fullmatch(r"_repr_\w+_", n.name))  # IPython's display hooks are a public protocol
    return classes, private


def _empty(value: ast.AST) -> bool:
    """``[]``, ``{}``, ``set()``, ``list()``, ``dict()``: a container made to be filled later."""
    if isinstance(value, (ast.List, ast.Set)) and not value.elts or isinstance(value, ast.Dict) and not value.keys:
        return True
    return isinstance(value, ast.Call) and ast.unparse(value.func) in MUTABLE_CALLS and not value.args


def _makes_state(value: ast.AST) -> bool:
    """A call of STATE_CALLS (a lock, an event, a ContextVar, a pool), also inside a comprehension."""
    return any(isinstance(n, ast.Call) and ast.unparse(n.func).split(".")[-1] in STATE_CALLS for n in ast.walk(value))


def _set_from_outside(tree: ast.AST) -> set[str]:
    """``module.name = value`` at another module's top level: that module's ``name`` is state (we
    report it under the name, in the module that defines it)."""
    return {node.targets[0].attr for node in getattr(tree, "body", []) if isinstance(node, ast.Assign)
            and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
            and isinstance(node.targets[0].value, ast.Name)}


@functools.lru_cache(maxsize=1)
def _names_set_from_outside() -> frozenset[str]:
    return frozenset(name for p in sources() for name in _set_from_outside(parsed(p)))


def module_state(path: Path, set_elsewhere: frozenset[str] | None = None) -> list[str]:
    """Names a module keeps state in: rebound with ``global``; a mutable container bound to a
    lowercase name (UPPER names are constant tables), or an empty one bound to any name (filled at
    import, by a decorator or later); an instance of one of tpunb's classes bound to an UPPER name;
    a lock, event, ContextVar or pool (alone or in a container); and a name another module assigns."""
    tree = parsed(path)
    found = {name for node in ast.walk(tree) if isinstance(node, ast.Global) for name in node.names}
    classes = _our_names()[0]
    set_elsewhere = _names_set_from_outside() if set_elsewhere is None else set_elsewhere
    for node in tree.body:
        if isinstance(node, ast.Assign):
            names, value = [t.id for t in node.targets if isinstance(t, ast.Name)], node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            names, value = [node.target.id], node.value
        else:
            continue
        call = value.func.id if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) else (
            value.func.attr if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) else None)
        container = isinstance(value, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)) or \
            call in MUTABLE_CALLS
        for name in names:
            if name.startswith("__"):
                continue
            constant = name.lstrip("_").isupper()
            if (container and not constant) or (constant and call in classes and call not in MUTABLE_CALLS) \
                    or _empty(value) or _makes_state(value) or name in set_elsewhere:
                found.add(name)
    return sorted(found)


def test_kernel_code_keeps_at_most_three_module_level_states():
    """Kernel state lives in one SliceManager; besides it, one cache and one once-only set. What
    guards or carries them, and what is filled at import, is listed apart, each with why."""
    found = {(str(p.relative_to(PACKAGE)), name) for p in sources()
             if p.relative_to(PACKAGE).parts[0] not in KERNEL_EXCLUDED for name in module_state(p)}
    listed = set(STATE_ALLOWED) | set(SUPPORT_ALLOWED)
    assert found == listed, f"module-level state not listed: {sorted(found - listed)}; listed but gone: " \
                            f"{sorted(listed - found)}"
    assert len(STATE_ALLOWED) <= 3


def test_the_state_check_sees_a_module_global(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("LIMITS = {'a': 1}\n_seen = []\n_lock = None\ndef f():\n    global _lock\n    _lock = 1\n")
    assert module_state(path, frozenset()) == ["_lock", "_seen"]


def test_the_state_check_sees_contextvars_locks_registries_and_names_set_from_outside(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import contextvars, threading\nfrom concurrent.futures import ThreadPoolExecutor\n"
                    "TABLE = {'a': 1}\nNAMES = ('x', 'y')\n"
                    "_current = contextvars.ContextVar('c', default=None)\n_LOCK = threading.Lock()\n"
                    "CHECKS: list = []\nREADY = {name: threading.Event() for name in NAMES}\n"
                    "_POOL = ThreadPoolExecutor(1)\nlookup = None\nLIMIT = 3\n")
    assert module_state(path, frozenset({"lookup"})) == ["CHECKS", "READY", "_LOCK", "_POOL", "_current", "lookup"]
    setter = tmp_path / "n.py"
    setter.write_text("from tpunb.fetch import hub\nhub.secret_lookup = print\n")
    assert _set_from_outside(parsed(setter)) == {"secret_lookup"}


def private_calls_on_others(path: Path) -> list[str]:
    """Calls of a ``_private`` method of tpunb's on an object that is not ``self`` or ``cls`` (a module's
    own functions, called by bare name, are fine)."""
    tree = parsed(path)
    ours = _our_names()[1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name, owner = node.func.attr, node.func.value
            if name in ours and not (isinstance(owner, ast.Name) and owner.id in ("self", "cls", "super")):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {ast.unparse(node.func)}")
    return found


def test_no_module_calls_another_objects_private_methods():
    found = [call for p in sources() for call in private_calls_on_others(p)]
    assert not found, "private methods called on other objects: " + ", ".join(found)


def test_the_private_call_check_sees_one(tmp_path):
    path = PACKAGE / "_probe_for_test_layout.py"  # inside the package: its path is read relative to it
    path.write_text("def f(session):\n    session._start(None, {})\n    self = session\n    self._start(None, {})\n")
    try:
        assert private_calls_on_others(path) == ["_probe_for_test_layout.py:2 session._start"]
    finally:
        path.unlink()


# -- the backend boundary -------------------------------------------------------------------------
PROVISION = PACKAGE / "provision"


#: provision's constants that hold backend names: comparing with them is branching on a backend
NAME_CONSTANTS = ("THIS_MACHINE", "BRING_YOUR_OWN", "LAUNCH_BACKENDS", "BACKEND_NAMES")


def backend_names() -> tuple[str, ...]:
    from tpunb import provision

    return provision.BACKEND_NAMES


def backend_named(path: Path, names: tuple[str, ...]) -> list[str]:
    """Where a module names a backend: a comparison with a backend's name (``record.backend ==
    "local"``, ``backend not in (None, "local")``), an import of a backend's module, or an attribute
    ``provision.<backend>``. Only tpunb/provision/ may: everyone else asks a backend for a
    capability or a record."""
    modules = {f"tpunb.provision.{n}" for n in names}
    found = []
    where = path.relative_to(PACKAGE) if path.is_relative_to(PACKAGE) else path.name

    def literal_names(node: ast.AST) -> list[str]:
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return [i.value for i in items if isinstance(i, ast.Constant) and i.value in names] + \
            [ast.unparse(i) for i in items if isinstance(i, ast.Attribute) and i.attr in NAME_CONSTANTS
             and ast.unparse(i.value).split(".")[-1] == "provision"]

    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                found += [f"{where}:{node.lineno} compares with {n!r}" for n in literal_names(side)]
        elif isinstance(node, ast.Import):
            found += [f"{where}:{node.lineno} imports {a.name}" for a in node.names
                      if any(a.name == m or a.name.startswith(m + ".") for m in modules)]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
            found += [f"{where}:{node.lineno} imports {t}" for t in targets
                      if any(t == m or t.startswith(m + ".") for m in modules)][:1]
        elif isinstance(node, ast.Attribute) and node.attr in names and \
                ast.unparse(node.value).split(".")[-1] == "provision":
            found.append(f"{where}:{node.lineno} uses {ast.unparse(node)}")
    return found


def test_no_module_outside_provision_names_a_backend():
    names = backend_names()
    found = [hit for p in sources() if not p.is_relative_to(PROVISION)
             for hit in backend_named(p, names)]
    assert not found, "backends named outside tpunb/provision/: " + "; ".join(found)


def test_the_backend_check_sees_a_branch_an_import_and_an_attribute(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from tpunb import provision\nfrom tpunb.provision.gcp.config import cached\n"
                     "import tpunb.provision.local\n"
                     "def f(record):\n    if record.backend == 'gcp' or record.backend not in (None, 'local'):\n"
                     "        return provision.ssh.options()\n    return record.backend == provision.THIS_MACHINE\n")
    found = backend_named(probe, ("local", "ssh", "gcp"))
    assert sorted(found) == ["probe.py:2 imports tpunb.provision.gcp.config", "probe.py:3 imports tpunb.provision.local",
                             "probe.py:5 compares with 'gcp'", "probe.py:5 compares with 'local'",
                             "probe.py:6 uses provision.ssh", "probe.py:7 compares with 'provision.THIS_MACHINE'"], found


EXTENSION = PACKAGE.parent / "extension" / "src"
TS_COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
TS_STRINGS = re.compile(r"'([^'\\\n]*)'|\"([^\"\\\n]*)\"|`([^`\\$]*)`")


def ts_backend_names(text: str, names: tuple[str, ...], where: str) -> list[str]:
    """String literals of the sidebar's TypeScript that are a backend's name (comments aside): the
    panel gets backends from the server (``provision.describe``) and names none itself."""
    code = TS_COMMENTS.sub("", text)
    return [f"{where}:{code.count(chr(10), 0, m.start()) + 1} names {value!r}" for m in TS_STRINGS.finditer(code)
            for value in m.groups() if value in names]


def test_the_sidebar_names_no_backend():
    names = backend_names()
    found = [hit for p in sorted(EXTENSION.glob("*.ts")) for hit in ts_backend_names(p.read_text(), names, p.name)]
    assert len(list(EXTENSION.glob("*.ts"))) >= 3
    assert not found, "the sidebar branches on backend names (ask the server's catalog instead): " + "; ".join(found)


def test_the_sidebar_check_sees_a_branch_and_a_menu_but_not_a_comment():
    planted = ("// 'local' in a comment is fine\n/* so is 'gcp' */\nconst free = slice.backend === 'local';\n"
               "const menu = [[\"gcp\", 'Cloud TPU']];\nconst label = `ssh`;\n")
    assert ts_backend_names(planted, ("local", "ssh", "gcp"), "panel.ts") == [
        "panel.ts:3 names 'local'", "panel.ts:4 names 'gcp'", "panel.ts:5 names 'ssh'"]


# -- one way to fan out -----------------------------------------------------------------------------
#: where kernel code may start a thread besides tpunb/transport/fanout.py: long-lived threads, one per
#: connection, feed or process, and the engine's own request machinery. (file, target) -> why
THREADS_ALLOWED = {
    ("engine/connection.py", "self._read_loop"): "one per host connection: reads its frames",
    ("engine/connection.py", "self._ended"): "one per host connection: reaps its agent when it ends",
    ("engine/programs.py", "self._run"): "one per followed host: reads its long-lived program's frames",
    ("engine/programs.py", "_Reader()"): "follow_hosts makes one per host in a loop (each starts the reader "
                                         "above): the engine's program route, where a thread per host is the design",
    ("engine/routes.py", "self._stream"): "the engine's route: one sender per host of a request's parts",
    ("engine/request.py", "go"): "the engine: a request started in the background waits on its own thread",
    ("engine/request.py", "self.connection(i).signal"): "the engine's escalation: SIGTERM/SIGKILL one host",
    ("engine/session.py", "_watch"): "one per session: liveness (heartbeats and deaths)",
    ("transport/ssh_hosts.py", "self._drain_stderr"): "one per SSH agent process: its stderr",
    ("transport/ssh_hosts.py", "self._transport.kill_from_new_connection"): "one per SSH kill: a frozen connection",
    ("transport/ssh_hosts.py", "old.close"): "one per dropped SSH connection: closed without holding the caller",
    ("transport/pipes.py", "self._drain_stderr"): "one per local host process: its stderr",
    ("transport/pipes.py", "self.close"): "one per local host process: reaped without holding the caller",
    ("transport/exec.py", "self._reap"): "one per abandoned exec agent: the kill run in its pod (its channel "
                                          "may be stuck), and its command reaped",
    ("transport/forkserver.py", "self._read"): "one per fork server (one a kernel): its answers and its agents' ends",
    ("transport/fanin.py", "self._run"): "one per session: the selector that reads every local host's frames",
    ("transport/sftp.py", "self._read_replies"): "one per SFTP connection: its replies",
    ("forwards/port_forward.py", "self._accept"): "one per port forward: its listener",
    ("forwards/port_forward.py", "self._serve"): "one per forwarded connection",
    ("forwards/openssh.py", "ThreadPoolExecutor"): "the OpenSSH spawner: one thread forks every ssh ControlMaster",
    ("forwards/openssh.py", "self._run"): "one per OpenSSH ControlMaster: carries its mux socket",
    ("metrics/feed.py", "self._run"): "one per metrics feed",
    ("provision/gcp/watch.py", "self._watch"): "one per cloud node or Compute Engine slice: its preemption watch",
    ("provision/warm.py", "_import_all"): "one per kernel: imports what Ctrl-C must not cut, ahead of time",
    ("provision/warm.py", "_import_compute"): "once per kernel: google-cloud-compute, when first needed and "
                                              "not already on the warm-up thread",
    ("engine/standby.py", "self._prepare_when_quiet"): "one per slice: starts standby agents once quiet",
    ("engine/standby.py", "self._launch"): "one per slice: the standby agents' start",
    ("engine/standby.py", "standby.close"): "one per dropped standby: ended without holding the caller",
    ("engine/background.py", "self._serve"): "one per slice: runs its queue of background cells",
    ("stuck/laggards.py", "self._read"): "one per slow request: reads the late hosts' stacks",
    ("bench/__init__.py", "work"): "one per %tpu_bench run: its asyncio client, which the notebook's Ctrl-C stops",
}
#: sleep-poll loops kernel code may keep outside tpunb/engine/ and fan_out: (file, function) -> why.
#: A poll of a remote API names the API it waits on; a period is a timer, not a poll.
SLEEPS_ALLOWED = {
    ("provision/ssh.py", "connect_hosts"): "backoff between SSH tries while fresh VMs start their sshd",
    ("provision/local.py", "end_hosts"): "another kernel's host processes: only their state can be read",
    ("provision/gcp/tpu/api.py", "create"): "API: Cloud TPU operations.get and nodes.get, until a create ends",
    ("provision/gcp/tpu/failover.py", "run"): "API: Cloud TPU operations.get of every zone's attempt, raced",
    ("provision/gcp/tpu/__init__.py", "_say_idle_problem"): "API: Cloud TPU nodes.getGuestAttributes (the watchdog's word)",
    ("provision/gcp/compute/compute_node.py", "say_idle_problem"): "API: Compute Engine instances.getGuestAttributes",
    ("provision/gcp/compute/make.py", "_wait_running"): "API: Compute Engine instances.get, until RUNNING",
    ("provision/gcp/compute/bulk.py", "wait_up"): "API: Compute Engine instanceGroupManagers.listManagedInstances",
    ("provision/gcp/compute/hostkeys.py", "pin"): "API: Compute Engine instances.getGuestAttributes (hostkeys/)",
    ("forwards/openssh.py", "__init__"): "the ControlMaster's socket file: OpenSSH gives no event when it exists",
    ("metrics/feed.py", "_run"): "a period, not a poll: the feed reads the registry every interval until stopped",
    ("provision/gcp/watch.py", "_watch"): "a period, not a poll: the preemption watch asks the cloud every interval",
    ("provision/warm.py", "ready"): "an event's wait in ticks of WAKE, so a Ctrl-C is seen while imports finish",
}
#: calls that wait with a timeout: a sleep in another name when they are in a loop
TIMED_WAITS = ("wait",)
PAUSES = ("sleep", "pause")


def _kernel_files() -> list[Path]:
    return [p for p in sources()
            if p.relative_to(PACKAGE).parts[0] not in ("host", "sandbox", "emulator", "serve") and str(p.relative_to(PACKAGE)) != "transport/fanout.py"]


LOOPS = (ast.For, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _starts_thread(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and (ast.unparse(n.func) in ("threading.Thread", "Thread")
                                            or ast.unparse(n.func).endswith("ThreadPoolExecutor")) for n in ast.walk(node))


@functools.lru_cache(maxsize=1)
def classes_starting_threads() -> frozenset[str]:
    """tpunb's classes whose constructor starts a thread (in ``__init__``, or a method it calls on self)."""
    return starting_in(sources())


def starting_in(paths: list[Path]) -> frozenset[str]:
    """The classes of these modules whose constructor starts a thread."""
    found = set()
    for path in paths:
        for cls in ast.walk(parsed(path)):
            if isinstance(cls, ast.ClassDef):
                methods = {m.name: m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
                init = methods.get("__init__")
                if init is None:
                    continue
                called = {n.func.attr for n in ast.walk(init) if isinstance(n, ast.Call)
                          and isinstance(n.func, ast.Attribute) and ast.unparse(n.func.value) == "self"}
                if _starts_thread(init) or any(_starts_thread(methods[m]) for m in called if m in methods):
                    found.add(cls.name)
    return frozenset(found)


def threads_started(path: Path, starting: frozenset[str] | None = None) -> list[tuple[str, str, bool]]:
    """(file, target, in a loop) for every thread or pool a module starts: ``threading.Thread(target=X)``,
    ``ThreadPoolExecutor(...)``, and a class of ours whose constructor starts one (target: the class);
    "in a loop": inside a for, while or comprehension."""
    tree = parsed(path)
    starting = classes_starting_threads() if starting is None else starting
    looped = {id(inner) for node in ast.walk(tree) if isinstance(node, LOOPS) for inner in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        called = ast.unparse(node.func)
        if called.endswith("ThreadPoolExecutor"):
            target = "ThreadPoolExecutor"
        elif called in ("threading.Thread", "Thread"):
            target = next((ast.unparse(k.value) for k in node.keywords if k.arg == "target"), "?")
        elif called.split(".")[-1] in starting and id(node) in looped:
            target = called.split(".")[-1] + "()"
        else:
            continue
        found.append((str(path.relative_to(PACKAGE)), target, id(node) in looped))
    return sorted(found)


def _pauses_in(node: ast.AST) -> bool:
    """A sleep in any name: ``time.sleep``, a ``pause`` (``api.pause``), or a wait with only a timeout
    (``Event().wait(0.1)``, ``Condition.wait(timeout=1)``; ``clients.wait(project, op)`` is an API's)."""
    if not isinstance(node, ast.Call):
        return False
    name = ast.unparse(node.func).split(".")[-1]
    if name in PAUSES:
        return True
    return name in TIMED_WAITS and len(node.args) + len(node.keywords) == 1 and \
        (len(node.args) == 1 or node.keywords[0].arg == "timeout")


def sleep_polls(path: Path) -> list[tuple[str, str]]:
    """(file, function) for every sleep, pause or timed wait inside a loop."""
    tree = parsed(path)
    found = []
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for loop in ast.walk(function):
                if isinstance(loop, (ast.For, ast.While)) and any(_pauses_in(n) for n in ast.walk(loop)):
                    found.append((str(path.relative_to(PACKAGE)), function.name))
                    break
    return sorted(set(found))


def test_threads_fan_out_in_one_place():
    """Work on N hosts (or zones) at once goes through tpunb/transport/fanout.py: one deadline, one Ctrl-C rule,
    one partial-failure result. Other threads are long-lived, one per connection, feed or process,
    each listed with its reason; none is started in a loop outside the engine."""
    found = [t for p in _kernel_files() for t in threads_started(p)]
    unlisted = [f"{file}: {target}" for file, target, _ in found if (file, target) not in THREADS_ALLOWED]
    assert not unlisted, "threads started outside tpunb/transport/fanout.py: " + ", ".join(unlisted)
    loops = [f"{file}: {target}" for file, target, looped in found if looped and not file.startswith("engine/")]
    assert not loops, "a thread per host in a loop (use tpunb.transport.fanout.fan_out): " + ", ".join(loops)
    stale = set(THREADS_ALLOWED) - {(file, target) for file, target, _ in found}
    assert not stale, f"listed but gone: {sorted(stale)}"


def test_no_sleep_poll_outside_the_engine_but_the_listed_ones():
    found = {s for p in _kernel_files() if p.relative_to(PACKAGE).parts[0] != "engine" for s in sleep_polls(p)}
    assert found == set(SLEEPS_ALLOWED), f"unlisted: {sorted(found - set(SLEEPS_ALLOWED))}; " \
                                         f"gone: {sorted(set(SLEEPS_ALLOWED) - found)}"


def test_the_thread_check_sees_a_thread_started_by_a_constructor_called_in_a_loop():
    path = PACKAGE / "_probe_ctor_for_test_layout.py"
    path.write_text("import threading\nclass Reader:\n    def __init__(self, host):\n        self._go()\n"
                    "    def _go(self):\n        threading.Thread(target=self._read).start()\n"
                    "    def _read(self):\n        pass\n"
                    "def follow(hosts):\n    return [Reader(h) for h in hosts]\n")
    try:
        assert starting_in([path]) == {"Reader"}
        assert threads_started(path, starting_in([path])) == [("_probe_ctor_for_test_layout.py", "Reader()", True),
                                                               ("_probe_ctor_for_test_layout.py", "self._read", False)]
    finally:
        path.unlink()


def test_the_thread_and_sleep_checks_see_a_loop_of_threads_and_a_poll(tmp_path):
    path = PACKAGE / "_probe_threads_for_test_layout.py"
    path.write_text("import threading, time\nfrom concurrent.futures import ThreadPoolExecutor\n"
                    "def f(hosts):\n    for h in hosts:\n        threading.Thread(target=h.connect).start()\n"
                    "    with ThreadPoolExecutor(4) as pool:\n        pass\n"
                    "    while not hosts:\n        time.sleep(0.1)\n")
    try:
        assert threads_started(path) == [("_probe_threads_for_test_layout.py", "ThreadPoolExecutor", False),
                                         ("_probe_threads_for_test_layout.py", "h.connect", True)]
        assert sleep_polls(path) == [("_probe_threads_for_test_layout.py", "f")]
    finally:
        path.unlink()


def test_the_poll_check_sees_pauses_and_timed_waits_but_not_an_apis_wait():
    path = PACKAGE / "_probe_polls_for_test_layout.py"
    path.write_text("import threading\nfrom tpunb.provision.gcp import api\n"
                    "def paused(node):\n    while not node.ready():\n        api.pause(1.0)\n"
                    "def evented(path):\n    while not path.exists():\n        threading.Event().wait(0.005)\n"
                    "def conditioned(cond, ready):\n    for _ in range(9):\n        cond.wait(timeout=1)\n"
                    "def api_wait(clients, ops):\n    for op in ops:\n        clients.wait('project', op, 'make')\n"
                    "def once(event):\n    event.wait(3)\n")
    try:
        assert sleep_polls(path) == [("_probe_polls_for_test_layout.py", name) for name in ("conditioned", "evented", "paused")]
    finally:
        path.unlink()


def private_imports(path: Path) -> list[str]:
    """``from tpunb.x import _name``: a module's private name used by another (an alias is fine)."""
    found = []
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tpunb") or \
                isinstance(node, ast.ImportFrom) and node.level:
            found += [f"{path.relative_to(PACKAGE)}:{node.lineno} {a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_private_name_is_imported_across_modules():
    found = [hit for p in sources() for hit in private_imports(p)]
    assert not found, "private names imported from other modules: " + ", ".join(found)


def test_the_private_import_check_sees_one():
    path = PACKAGE / "_probe_private_for_test_layout.py"
    path.write_text("from tpunb.magics import _parse, usage\nfrom tpunb import catalog as _catalog\n"
                    "from . import _secret\n")
    try:
        assert private_imports(path) == ["_probe_private_for_test_layout.py:1 _parse",
                                         "_probe_private_for_test_layout.py:3 _secret"]
    finally:
        path.unlink()


# -- one status model: what a slice costs, when it idles out, which services hold it ------------------
VIEW = PACKAGE / "overview.py"
#: the view's rules and rows: defined in overview.py only, everyone else reads the view
VIEW_RULES = {"usd_so_far", "idle_delete_in", "busy_services", "service_rows", "forward_rows", "snapshot_rows"}
#: where a price over hours is computed for something that is not a slice's bill
COST_ALLOWED = {"plan": "the planner's estimate of a job's cost before any slice exists"}


def _mentions_price(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and ("usd" in n.id or "price" in n.id) or
               isinstance(n, ast.Attribute) and ("usd" in n.attr or "price" in n.attr) for n in ast.walk(node))


def status_rules_outside_the_view(path: Path) -> list[str]:
    """The idle rule, the cost rule or a status row made outside ``overview.py``: a function of
    that name, a dict key or keyword of that name given a value, the raw idle mark read
    (``.idle_mark(...)``: whoever reads it counts down), or a price times seconds over 3600."""
    if path == VIEW:
        return []
    where = str(path.relative_to(PACKAGE))
    found = []
    for node in ast.walk(parsed(path)):
        named = None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in VIEW_RULES:
            named = f"def {node.name}"
        elif isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in VIEW_RULES]
            named = f"{{{keys[0]!r}: ...}}" if keys else None
        elif isinstance(node, ast.keyword) and node.arg in VIEW_RULES:
            named = f"{node.arg}=..."
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "idle_mark":
            named = "idle_mark(...)"
        elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant)
              and node.right.value == 3600 and _mentions_price(node.left) and where.split("/")[0] not in COST_ALLOWED):
            named = ast.unparse(node)
        if named:
            found.append((node.lineno, f"{where}:{node.lineno} {named}"))
    return [hit for _, hit in sorted(found)]


def test_idle_cost_and_status_rows_are_computed_in_the_status_view_only():
    found = [hit for p in _kernel_files() for hit in status_rules_outside_the_view(p)]
    assert not found, "computed outside tpunb/overview.py (read the view instead): " + ", ".join(found)


def test_the_status_rule_check_sees_each_kind_of_copy():
    path = PACKAGE / "_probe_status_for_test_layout.py"
    path.write_text("def usd_so_far(row):\n    return row.usd_per_hour * row.running_s / 3600\n"
                    "left = reg.idle_mark(name)\nrow = {'idle_delete_in': left}\nHostRow(busy_services=[])\n"
                    "hours = seconds / 3600\n")
    try:
        assert status_rules_outside_the_view(path) == [
            "_probe_status_for_test_layout.py:1 def usd_so_far",
            "_probe_status_for_test_layout.py:2 row.usd_per_hour * row.running_s / 3600",
            "_probe_status_for_test_layout.py:3 idle_mark(...)",
            "_probe_status_for_test_layout.py:4 {'idle_delete_in': ...}",
            "_probe_status_for_test_layout.py:5 busy_services=...",
        ]
    finally:
        path.unlink()


def _tests_and_their_markers() -> list[tuple[str, str, set[str]]]:
    """(where, source, markers) of every test function in tests/: its own marks and its module's."""
    found = []
    for path in sorted(Path(__file__).resolve().parent.glob("test_*.py")):
        if path.name == Path(__file__).name:  # its own planted examples
            continue
        text = path.read_text()
        tree = ast.parse(text)
        module = set()
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
                module |= set(re.findall(r"pytest\.mark\.(\w+)", ast.get_source_segment(text, node.value) or ""))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                own = {m for d in node.decorator_list for m in re.findall(r"pytest\.mark\.(\w+)", ast.unparse(d))}
                found.append((f"{path.name}::{node.name}", ast.get_source_segment(text, node) or "", module | own))
    return found


#: what a test's own code does when it takes a slice of its own (a launch, a connect, their magics)
TAKES_A_SLICE = re.compile(r"\b(manager|tpunb|MANAGER)\.(launch|connect|use)\(|%tpu_(launch|connect|use)\b|"
                           r"make_slice\.line\(")
#: what a test's own code names when its hosts (or a kernel it starts) run JAX
NAMES_JAX = re.compile(r"import (jax|orbax|flax)|from (jax|orbax|flax)\b|\bjax\.[A-Za-z_]")


def _unmarked(rule: re.Pattern, marker: str, tests=None) -> list[str]:
    return [where for where, source, marks in (tests if tests is not None else _tests_and_their_markers())
            if rule.search(source) and marker not in marks]


def test_a_test_that_takes_a_slice_of_its_own_is_marked_fresh_slice():
    """Warm slices are the default (tests/warm.py); a test that launches, connects or attaches a
    slice itself says so, so the split is visible (conftest.py also catches it at run time, through
    fixtures and helpers this cannot see)."""
    assert not _unmarked(TAKES_A_SLICE, "fresh_slice"), "mark them @pytest.mark.fresh_slice"


def test_a_test_that_names_jax_for_its_hosts_is_marked_jax():
    """conftest.py sees the hosts of this process's slices load JAX; a kernel a test starts runs
    slices of its own, out of its sight. So a test whose code names JAX, orbax or flax says so."""
    assert not _unmarked(NAMES_JAX, "jax"), "mark them @pytest.mark.jax"


def test_the_marker_rules_see_what_they_guard():
    planted = [("t.py::test_a", "def test_a(cell):\n    cell('%tpu_launch v4-8')\n", set()),
               ("t.py::test_b", "def test_b():\n    manager.connect(hosts)\n", {"jax"}),
               ("t.py::test_c", "def test_c(make_slice):\n    make_slice(2)\n", set()),
               ("t.py::test_d", "def test_d(cell):\n    cell('%%on_tpu\\nimport jax')\n", {"fresh_slice"})]
    assert _unmarked(TAKES_A_SLICE, "fresh_slice", planted) == ["t.py::test_a", "t.py::test_b"]
    assert _unmarked(NAMES_JAX, "jax", planted) == ["t.py::test_d"]


def _packages_named(text: str) -> set[str]:
    """The packages under tpunb/ a test module's code names (``tpunb.X.Y`` imports, ``from tpunb import X``)."""
    named = set(re.findall(r"\btpunb((?:\.\w+)+)", text))
    for names in re.findall(r"from tpunb import ([\w, ()\n]+)", text):
        named |= {"." + n.strip() for n in re.split(r"[,\s()]+", names) if n.strip()}
    found = set()
    for dotted in named:
        parts = dotted.strip(".").split(".")
        for end in range(len(parts), 0, -1):  # the deepest package it reaches
            if (PACKAGE.joinpath(*parts[:end]) / "__init__.py").is_file():
                found.add("/".join(parts[:end]))
                break
    return found


def fast_loop_files(request, root: Path) -> set[str]:
    """The test files ./scripts/test --fast runs tests of: from this session's own collection when it
    collected every test file (the suite's fast phase does), else from pytest's --collect-only."""
    from tests.markers import COLLECTED, FAST_EXPRESSION

    every = {p.relative_to(root).as_posix() for p in (root / "tests").glob("test_*.py")}
    items = request.config.stash.get(COLLECTED, [])
    if every <= {path for path, _ in items}:
        return {path for path, fast in items if fast}
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             "-m", FAST_EXPRESSION, "tests"], cwd=root, capture_output=True, text=True, timeout=300)
    files = {line.split("::")[0] for line in listed.stdout.splitlines() if "::" in line}
    assert files, listed.stdout[-2000:] + listed.stderr[-2000:]
    return files


def test_the_fast_loop_selects_tests_of_every_package(request):
    """./scripts/test --fast (tests/markers.py's FAST_EXPRESSION) is worth running: what it selects
    reaches every package under tpunb/."""
    root = Path(__file__).resolve().parent.parent
    files = fast_loop_files(request, root)
    reached = set().union(*(_packages_named((root / f).read_text()) for f in files))
    packages = {str(p.parent.relative_to(PACKAGE)) for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE}
    assert not packages - reached, f"no test the fast loop runs names these packages: {sorted(packages - reached)}"


#: the gcp backend's two handlers (choice.py chooses between them)
GCP = "tpunb.provision.gcp"
HANDLER_PACKAGES = (f"{GCP}.tpu", f"{GCP}.compute")
#: rooms that may reach into a handler: the sandbox stands in for the APIs the handlers call
HANDLERS_READ_BY = ("tpunb.sandbox",)


def handler_crossings(edges: dict[str, set[str]]) -> list[str]:
    """Imports that break the gcp backend's shape: a handler importing the other handler, or the
    backend's own modules above the shared ones (its facade, choice.py); a module outside the
    backend importing a handler's parts instead of asking the backend."""
    found = []
    for name, targets in edges.items():
        mine = next((h for h in HANDLER_PACKAGES if _within(name, (h,))), None)
        for target in sorted(targets):
            theirs = next((h for h in HANDLER_PACKAGES if _within(target, (h,))), None)
            if mine and ((theirs and theirs != mine) or target in (GCP, f"{GCP}.choice")):
                found.append(f"{name} -> {target}")
            elif (not mine and theirs and not _within(name, (GCP,))
                  and not _within(name, HANDLERS_READ_BY)):
                found.append(f"{name} -> {target}")
    return found


def test_the_gcp_handlers_share_only_the_backends_shared_modules():
    assert handler_crossings(graph()) == []


def test_the_handler_check_sees_a_crossing():
    edges = {f"{GCP}.compute.make": {f"{GCP}.tpu.api", f"{GCP}.shared"}, f"{GCP}.tpu.node": {GCP},
             "tpunb.overview": {f"{GCP}.compute.found"}, f"{GCP}.choice": {f"{GCP}.tpu"}}
    assert handler_crossings(edges) == [f"{GCP}.compute.make -> {GCP}.tpu.api", f"{GCP}.tpu.node -> {GCP}",
                                        f"tpunb.overview -> {GCP}.compute.found"]


#: what choosing between the Cloud TPU API and Compute Engine looks like in code
API_CHOICE = re.compile(r"\b(default_api|no_tpu_api|uses_compute|on_compute|check_tpu_api)\b"
                        r"|(?:get\(\s*[\"']api[\"']\s*\)|\[\s*[\"']api[\"']\s*\])\s*(?:==|!=|\bin\b)"
                        r"|[\"'](?:compute|tpu)[\"']\s*(?:==|!=)\s*\w+(?:\.\w+)*(?:\.get\(\s*[\"']api[\"']\s*\)|\[[\"']api[\"']\])")
#: modules outside provision/gcp/ that may (each with why)
API_CHOICE_ALLOWED: dict[str, str] = {}


def api_choices(files: dict[str, str]) -> list[str]:
    """``path:line`` of each place outside provision/gcp/ that asks which Google API makes a slice."""
    found = []
    for path, text in sorted(files.items()):
        if path.startswith("provision/gcp/") or path in API_CHOICE_ALLOWED:
            continue
        found += [f"{path}:{n}" for n, line in enumerate(text.splitlines(), 1)
                  if API_CHOICE.search(line.split("#", 1)[0])]
    return found


def test_only_the_gcp_backend_asks_which_api_makes_a_slice():
    files = {str(p.relative_to(PACKAGE)): p.read_text() for p in sources()}
    assert api_choices(files) == []
    assert all(path in files for path in API_CHOICE_ALLOWED)


#: a Google API's own resource names and paths: the watchdog shipped to worker 0 gets each call from its
#: handler's configuration (provision/gcp/*/idle_config), so its code names none of them
API_RESOURCES = re.compile(r"instanceGroupManagers|queuedResources|/nodes/|/instances/|instanceTemplates|"
                           r"resourcePolicies|getGuestAttributes|listManagedInstances|compute/v1|/v2\b|"
                           r"(?:tpu|compute)\.googleapis")


def api_resources_named(text: str) -> list[str]:
    """The string constants of a module's code (docstrings aside) that name a Google API's resource."""
    tree = ast.parse(text)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [f"{node.lineno}: {node.value}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            and API_RESOURCES.search(node.value)]


def test_the_idle_watchdog_makes_only_the_calls_its_handler_describes():
    assert api_resources_named((PACKAGE / "host" / "standalone" / "idle.py").read_text()) == []
    planted = ('"""Deletes a MIG via instanceGroupManagers."""\n'
               'def f(state):\n    """the node\'s /nodes/ path"""\n'
               '    return "/instanceGroupManagers/" in state["node"] or f"{state[\'api\']}/compute/v1"\n')
    assert api_resources_named(planted) == ["4: /instanceGroupManagers/", "4: /compute/v1"]


def test_the_api_choice_check_sees_each_form():
    planted = {"overview.py": "if record.spec.get('api') == 'compute':\n    pass\n",
               "catalog.py": "default_api: str = 'tpu'\n",
               "server/model.py": "x = 'compute' == record.spec['api']\n",
               "magics/core.py": "show(cloud.get('api'))  # shown, not chosen\n",
               "provision/gcp/choice.py": "record.spec.get('api') == 'compute'\n"}
    assert api_choices(planted) == ["catalog.py:1", "overview.py:1", "server/model.py:1"]


# -- names: every path the architecture names exists; basenames repeat only where listed -------------

#: basenames that may repeat under tpunb/, each with why
REPEATED_BASENAMES = {
    "__init__.py": "every package has one",
    "__main__.py": "`python -m tpunb`, `python -m tpunb.sandbox` and its old name `python -m tpunb.emulator`",
    "magics.py": "a feature's magics beside the feature (none today: they are in magics/)",
}
#: host halves: tpunb/host/X.py beside the kernel-side X.py of the same feature (one copy in host/)
HOST_HALVES = {
    "forkserver.py": "host/: the fork server local agents come from; transport/: the kernel's client of it",
    "jaxcache.py": "host/: stages and publishes compile-cache entries; fetch/: the kernel copies them to the other hosts",
    "preempt.py": "host/: watches for the notice and saves; snapshot/: arms it and recovers",
    "relay.py": "host/: forwards a push's chunks down the tree; engine/: the kernel's side of the relay",
    "spread.py": "host/: hands a fetched file's chunks on; fetch/: runs a fetch on a slice",
    "stacks.py": "host/: the faulthandler dump and its reader; stuck/: the Stacks record and its text",
    "transfer.py": "host/: reads a pushed value into place; engine/: pickles and sends it",
}
def repeated_basename_problems(paths: list[str]) -> list[str]:
    """Basenames (paths relative to tpunb/) that repeat outside the lists, and allowances that no
    longer repeat (so the lists stay the truth)."""
    by_name: dict[str, list[str]] = {}
    for path in paths:
        by_name.setdefault(path.rpartition("/")[2], []).append(path)
    problems = []
    for name, where in sorted(by_name.items()):
        if len(where) < 2 or name in REPEATED_BASENAMES:
            continue
        if name in HOST_HALVES and len(where) == 2 and any(w.startswith("host/") for w in where):
            continue
        problems.append(f"{name} repeats: {sorted(where)}")
    for name in HOST_HALVES:
        if len(by_name.get(name, [])) < 2:
            problems.append(f"{name} is listed as repeating but does not: drop it from the list")
    return problems


def test_basenames_repeat_only_where_listed():
    paths = [p.relative_to(PACKAGE).as_posix() for p in sources()]
    assert not repeated_basename_problems(paths), repeated_basename_problems(paths)


def test_the_basename_check_sees_a_repeat_and_a_stale_allowance():
    paths = [p.relative_to(PACKAGE).as_posix() for p in sources()]
    assert any("frames.py repeats" in p for p in repeated_basename_problems(paths + ["engine/frames.py", "stuck/frames.py"]))
    assert any("stacks.py repeats" in p for p in repeated_basename_problems(paths + ["display/stacks.py"]))
    assert any("relay.py is listed" in p for p in repeated_basename_problems([p for p in paths if p != "host/relay.py"]))


def architecture_section(text: str) -> str:
    return text.split("## Architecture", 1)[1].split("\n## ", 1)[0]


PATH_LIKE = re.compile(r"`((?:tpunb/)?(?:[\w.-]+/)+(?:[\w.-]+\.(?:py|json|ts|md))?)`")


def missing_architecture_paths(text: str) -> list[str]:
    """Paths the README's architecture section names in backticks (``tpunb/x/y.py``, ``x/y.py``,
    ``folder/``) that exist nowhere: not from the repository's root, not from tpunb/, not from a
    folder of tpunb/ (a paragraph names its package's files relative to it: ``compute/`` in the
    sandbox's). A folder exists when it holds something besides ``__pycache__``."""
    root = PACKAGE.parent
    folders = [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__")]
    missing = []
    for name in sorted(set(PATH_LIKE.findall(architecture_section(text)))):
        places = [root / name] if name.startswith("tpunb/") else [root / name, *(f / name for f in folders)]
        if not any(_exists(p) for p in places):
            missing.append(name)
    return missing


def _exists(path: Path) -> bool:
    return path.is_file() or (path.is_dir() and any(c.name != "__pycache__" for c in path.iterdir()))


def test_every_path_the_architecture_names_exists():
    text = README.read_text()
    assert len(PATH_LIKE.findall(architecture_section(text))) >= 50, "the README's architecture section was not found"
    assert not missing_architecture_paths(text), missing_architecture_paths(text)


def test_the_path_check_sees_a_name_that_is_gone():
    planted = ("## Architecture\nsee `tpunb/emulator/hub.py`, `serve/forward.py` and `nowhere/`, beside "
               "`engine/wire.py` and `hosts/pool.py`\n## Next\n")
    assert missing_architecture_paths(planted) == ["nowhere/", "serve/forward.py", "tpunb/emulator/hub.py"]


# -- sizes: a module a reader can hold; the Slice and the manager smaller still ----------------------

MODULE_LIMIT = 600
#: the two classes every user touches stay small: what does not fit is a part of its own
SMALLER = {"slice/slice.py": 400, "manager.py": 400}


def size_problems(lengths: dict[str, int]) -> list[str]:
    """Modules (paths relative to tpunb/) over 600 lines, and the Slice's or the manager's at 400 or more."""
    over = [f"{path}: {n} lines, more than {MODULE_LIMIT}" for path, n in sorted(lengths.items())
            if path not in SMALLER and n > MODULE_LIMIT]
    return over + [f"{path}: {lengths[path]} lines, {limit} or more" for path, limit in SMALLER.items()
                   if lengths.get(path, 0) >= limit]


def test_no_module_is_over_600_lines_and_the_slice_and_manager_are_under_400():
    lengths = {p.relative_to(PACKAGE).as_posix(): len(p.read_text().splitlines()) for p in sources()}
    assert all(path in lengths for path in SMALLER)
    assert size_problems(lengths) == []


def test_the_size_check_sees_a_module_too_long():
    assert size_problems({"engine/x.py": 601, "engine/y.py": 600, "slice/slice.py": 400, "manager.py": 399}) == [
        "engine/x.py: 601 lines, more than 600", "slice/slice.py: 400 lines, 400 or more"]
