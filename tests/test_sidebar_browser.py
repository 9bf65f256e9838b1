"""The sidebar in a real browser: a real ``jupyter lab`` process (with tpunb's built extension and
server extension, as ``pip install tpunb[lab]`` installs them) driven through Debian's headless
chromium by Playwright. Slices are real local slices: launched by this test process (as another
kernel would), and from the sidebar's launch form into a notebook's own kernel.

Needs chromium at /usr/bin/chromium and the sidebar built into ``tpunb/labextension`` of the tpunb
being tested (``jlpm build:prod`` in extension/; ./scripts/test builds it on install). The lab loads
that build before any copy installed in the environment, which may be older or another checkout's.
Playwright never downloads a browser here.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import tpunb
from tpunb.machine import procs
from tpunb import manager
from tpunb.errors import NoSliceError
from tpunb.registry import Registry
from tests.conftest import wait_for

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
TIMEOUT_MS = 60_000
SIDEBAR = "#tpunb-sidebar"
PROJECT, ZONE = "proj", "us-central2-b"


@dataclass
class Lab:
    url: str
    token: str
    home: Path
    root: Path
    log: Path

    def api(self, path: str, method: str = "GET") -> dict:
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read()
        return json.loads(body) if body else {}

    def shutdown_kernels(self) -> None:
        """Kernels run in their own sessions: stop them through the server, as the Kernel menu does."""
        for kernel in self.api("/api/kernels"):
            self.api(f"/api/kernels/{kernel['id']}", method="DELETE")


def _built_sidebar() -> Path:
    built = Path(tpunb.__file__).parent / "labextension"
    assert (built / "package.json").exists(), (
        f"the sidebar is not built in {built}: cd extension && jlpm install --immutable && jlpm build:prod")
    return built


def _sidebar_under_test(folder: Path) -> Path:
    """A labextensions folder holding this checkout's build, for --LabApp.extra_labextensions_path: the
    lab takes the first 'tpunb' it finds, and extra paths come before the environment's."""
    shutil.copytree(_built_sidebar(), folder / "tpunb")
    return folder


def _remote_entries(folder: Path) -> set[str]:
    return {f"static/{entry.name}" for entry in (folder / "static").glob("remoteEntry.*.js")}


def _cloud(emulator: str) -> dict[str, str]:
    return {"TPUNB_TPU_API_ENDPOINT": emulator, "GOOGLE_CLOUD_PROJECT": PROJECT, "CLOUDSDK_COMPUTE_ZONE": ZONE}


def _free_port() -> int:
    from tpunb.provision.local import free_port

    return free_port()


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def emulator() -> Iterator[str]:
    """The Cloud TPU API emulator, which the lab's server lists for orphaned nodes."""
    from tests.emulator_fixture import FAST
    from tpunb.sandbox import start_emulator

    url, handle = start_emulator(**FAST)
    yield url
    handle.stop()


@pytest.fixture(scope="module")
def lab(tmp_path_factory, emulator) -> Iterator[Lab]:
    """A real JupyterLab on loopback with its own TPUNB_HOME, news and update checks off, and a
    Google Cloud project configured on the Cloud TPU API emulator."""
    home, root = tmp_path_factory.mktemp("lab-tpunb-home"), tmp_path_factory.mktemp("lab-root")
    log = tmp_path_factory.mktemp("lab-log") / "lab.log"
    extensions = _sidebar_under_test(tmp_path_factory.mktemp("labextensions"))
    port, token = _free_port(), secrets.token_hex(16)
    labconfig = home / "jupyter-config" / "labconfig"  # no "get Jupyter news?" toast over the screenshots
    labconfig.mkdir(parents=True)
    (labconfig / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True},
         "exposeAppInBrowser": True}))  # window.jupyterapp: tests wait for the layout to be restored
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "TPUNB_HOME": str(home), "JUPYTER_CONFIG_DIR": str(home / "jupyter-config"),
           "JUPYTER_RUNTIME_DIR": str(home / "jupyter-runtime"),
           "JUPYTERLAB_WORKSPACES_DIR": str(home / "lab-workspaces"),
           "JUPYTERLAB_SETTINGS_DIR": str(home / "lab-settings"), **_cloud(emulator)}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--allow-root",
             "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
             f"--LabApp.extra_labextensions_path={extensions}"],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: proc.poll() is not None or _answers(f"{url}/api/status?token={token}"), 120,
                 "jupyter lab to answer")
        assert proc.poll() is None, f"jupyter lab exited: {log.read_text()[-2000:]}"
        yield Lab(url, token, home, root, log)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            # Seen with py-spy: the server has shut down and its main thread has returned, but an idle
            # AnyIO worker thread (jupyter_server's file I/O) is never told to stop and keeps the
            # process alive. Nothing is left to clean up, so end it.
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def lab_home(lab, monkeypatch) -> Lab:
    """This test's slices go in the registry the lab reads."""
    monkeypatch.setenv("TPUNB_HOME", str(lab.home))
    yield lab
    lab.shutdown_kernels()
    manager.detach_all()
    for record in Registry().list_slices():  # leave the module's lab with no slices for the next test
        Registry().delete_slice(record.name)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "chromium is missing: ./scripts/test installs it (apt-get install chromium)"
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, lab):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = context.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    yield pg
    context.close()


def _open_sidebar(page, lab: Lab, path: str = "lab", reset: bool = False) -> None:
    """``reset``: without the tabs earlier tests left open in the shared server's workspace."""
    page.goto(f"{lab.url}/{path}?{'reset&' if reset else ''}token={lab.token}")
    page.wait_for_function("() => window.jupyterapp !== undefined")
    page.evaluate("() => window.jupyterapp.restored")  # the saved layout may open the sidebar itself
    tab = page.locator(f'li[data-id="{SIDEBAR[1:]}"]')
    if page.locator(SIDEBAR).is_hidden():
        tab.click()
    page.locator(SIDEBAR).wait_for(state="visible")
    assert page.locator(f"{SIDEBAR} h2").inner_text() == "TPU slices"


def _delete_from_sidebar(page, name: str, without_polls: bool = False) -> None:
    """``without_polls``: the listing's GETs fail from the confirmation on, so the card can only
    go by the panel redrawing from the DELETE's answer (the fresh view)."""
    card = page.locator(f'{SIDEBAR} [data-slice="{name}"]')
    card.locator(".jp-tpunb-Delete").click()
    dialog = page.locator(".jp-Dialog")
    assert f"Delete {name}?" in dialog.inner_text()
    polls = []
    if without_polls:  # the panel's GETs carry a cache-busting query; a DELETE's path ends in /NAME
        page.route(_listing, lambda route: (polls.append(route.request.method), route.abort()))
    try:
        dialog.locator("button.jp-mod-warn").click()
        card.wait_for(state="detached")
    finally:
        if without_polls:
            page.unroute(_listing)
    assert "DELETE" not in polls


def _listing(url: str) -> bool:
    """The panel's GET /tpunb/api/slices (its query aside)."""
    return urllib.parse.urlsplit(url).path.endswith("/tpunb/api/slices")


def _dead(pid: int) -> bool:
    return not procs.alive(pid)  # ended, a zombie, or reaped while it was read


def _wait_for_memory_bars(page, within: str, count: int) -> None:
    """Until ``count`` memory bars under ``within`` show a sample (title and a filled bar)."""
    page.wait_for_function(f"""() => [...document.querySelectorAll('{SIDEBAR} {within} '
        + '.jp-tpunb-Bar[data-metric="memory"]')].filter(b => /^Mem: [0-9.]+ [KMGT]iB used of [0-9.]+ [KMGT]iB \\([0-9.]+%\\)$/.test(b.title)
        && parseFloat(b.querySelector('.jp-tpunb-BarFill').style.width) > 0).length === {count}""", timeout=30000)


def _screenshot(page, tmp_path: Path, name: str) -> Path:
    folder = Path(os.environ.get("TPUNB_SCREENSHOT_DIR") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    page.screenshot(path=str(path))
    return path


def test_lab_lists_the_extensions(lab):
    listing = subprocess.run([sys.executable, "-m", "jupyterlab.labextensions", "list"], capture_output=True,
                             text=True, check=True)
    line = next((l for l in (listing.stdout + listing.stderr).splitlines() if l.strip().startswith("tpunb ")), "")
    assert "enabled" in line and "OK" in line, f"the sidebar is not installed: {listing.stderr[-1500:]}"
    assert lab.api("/tpunb/api/slices")["slices"] == []


def test_the_lab_serves_the_sidebar_built_in_this_checkout(lab):
    with urllib.request.urlopen(f"{lab.url}/lab?token={lab.token}", timeout=30) as response:
        page = response.read().decode()
    config = json.loads(page.split('id="jupyter-config-data"', 1)[1].split(">", 1)[1].split("</script>", 1)[0])
    [sidebar] = [e for e in config["federated_extensions"] if e["name"] == "tpunb"]
    assert {sidebar["load"]} == _remote_entries(_built_sidebar()), "the lab must load tpunb/labextension"


@pytest.mark.fresh_slice
@pytest.mark.jax
def test_a_slice_appears_with_its_hosts_and_delete_ends_it(lab_home, page, tmp_path):
    sl = manager.launch("v4-16", name="demo")
    sl.run("import jax.numpy as jnp\nx = jnp.ones((1024, 256))", output=None).raise_for_status()  # 1 MiB on each host
    pids = [h.info["pid"] for h in sl.session.hosts]
    _open_sidebar(page, lab_home)
    card = page.locator(f'{SIDEBAR} [data-slice="demo"]')
    card.wait_for()
    text = card.inner_text()
    for expected in ("demo", "v4-16", "local (simulated)", "running", "$0.00/h", "host 0", "host 1"):
        assert expected in text
    assert card.locator(".jp-tpunb-Bar").count() == 6  # CPU, memory, HBM for each of 2 hosts
    assert card.locator(".jp-tpunb-SliceGroup").count() == 0  # one slice: no per-slice groups
    # the hosts' live metrics reach the bars: the kernel publishes them, the panel's poll draws them
    _wait_for_memory_bars(page, '[data-slice="demo"]', 2)
    # each bar's number beside it, its units on hover: CPU %, memory and HBM in binary units
    hbm = f'{SIDEBAR} [data-slice="demo"] .jp-tpunb-BarValue[data-metric="hbm"]'
    page.wait_for_function(f"() => [...document.querySelectorAll('{hbm}')].filter(v => v.textContent === '1.0 MiB'"
                           " && /^HBM: 1.0 MiB used by live arrays/.test(v.title)).length === 2", timeout=30000)
    for row in card.locator(".jp-tpunb-Host").all():
        value = {m: row.locator(f'.jp-tpunb-BarValue[data-metric="{m}"]') for m in ("cpu", "memory")}
        assert re.fullmatch(r"[0-9.]+%", value["cpu"].inner_text()), value["cpu"].inner_text()
        assert re.fullmatch(r"CPU: [0-9.]+% busy", value["cpu"].get_attribute("title"))
        assert re.fullmatch(r"[0-9.]+ [KMG]iB", value["memory"].inner_text()), value["memory"].inner_text()
        assert value["memory"].get_attribute("title").startswith(f"Mem: {value['memory'].inner_text()} used of ")
    _screenshot(page, tmp_path, "sidebar.png")
    _delete_from_sidebar(page, "demo", without_polls=True)
    assert all(_dead(pid) for pid in pids), "the slice's host processes must end"
    assert page.locator(f"{SIDEBAR} .jp-tpunb-Empty").is_visible()
    with pytest.raises(NoSliceError, match="'demo' was deleted outside this notebook"):
        sl.run("pass")  # the owning kernel's next cell says what happened, and forgets the slice
    with pytest.raises(NoSliceError, match="no slice yet"):
        manager.current()


@pytest.mark.fresh_slice
def test_metric_bars_move_and_stacks_show_while_a_cell_runs(lab_home, page, flags, tmp_path):
    """Host 1 spins in a function: its CPU bar fills, and its row's stacks button shows where it is,
    read by the server while this kernel's cell still runs."""
    sl = manager.launch("v4-16", name="busy")
    _open_sidebar(page, lab_home)
    cpu = f'{SIDEBAR} [data-slice="busy"] .jp-tpunb-Host:nth-child(2) .jp-tpunb-Bar[data-metric="cpu"]'
    page.locator(cpu).wait_for()
    page.wait_for_function(f"() => /CPU: [0-9.]+%/.test(document.querySelector('{cpu}').title)", timeout=30000)
    outcome = {}
    spin = (f"import os, time\ndef spinning():\n    while not os.path.exists('{flags}/stop'):\n        pass\n"
            "if os.environ['TPUNB_HOST_INDEX'] == '1':\n    spinning()\n")
    runner = threading.Thread(target=lambda: outcome.setdefault("result", sl.run(spin, output=None)))
    runner.start()
    try:  # host 1 spins: its CPU bar fills while the cell is still running
        page.wait_for_function(f"() => parseFloat(document.querySelector('{cpu}').title.split(': ')[1]) > 50",
                               timeout=30000)
        assert "result" not in outcome
        page.locator(f'{SIDEBAR} [data-slice="busy"] .jp-tpunb-Host[data-host="1"] .jp-tpunb-StacksButton').click()
        dialog = page.locator(".jp-Dialog")
        dialog.locator(".jp-tpunb-Stacks").wait_for()
        assert "busy host 1: where it is" in dialog.inner_text()
        shown = dialog.locator(".jp-tpunb-Stacks").inner_text()
        assert re.search(r"^\[1\] main thread: In\[\d+\]:6 <module> -> In\[\d+\]:3 spinning( -> exists)?$", shown, re.M), shown
        _screenshot(page, tmp_path, "sidebar-stacks.png")
        dialog.locator("button.jp-mod-accept").click()
        dialog.wait_for(state="detached")
        assert "result" not in outcome
    finally:
        (flags / "stop").touch()
        runner.join(30)
    assert outcome["result"].ok
    page.wait_for_function(f"() => parseFloat(document.querySelector('{cpu}').title.split(': ')[1]) < 50",
                           timeout=30000)
    manager.down("busy")


@pytest.mark.fresh_slice
@pytest.mark.sandbox
def test_a_cloud_slice_shows_its_price_per_hour(lab_home, page):
    from tpunb.sandbox.box import start_sandbox

    sandbox = start_sandbox(hosts=2)
    try:
        sl = manager.launch("v4-16", name="pod", backend="gcp")
        _open_sidebar(page, lab_home)
        card = page.locator(f'{SIDEBAR} [data-slice="pod"]')
        card.wait_for()
        usd = [s for s in lab_home.api("/tpunb/api/slices")["slices"] if s["name"] == "pod"][0]["usd_per_hour"]
        assert usd == sl.node.price_per_hour > 0
        assert f"${usd:,.2f}/h" in card.inner_text() and "gcp" in card.inner_text()
        manager.down("pod")
        card.wait_for(state="detached")
    finally:
        sandbox.stop()


def _write_notebook(lab: Lab, name: str) -> None:
    (lab.root / name).write_text(json.dumps({"cells": [], "metadata": {"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}))


def _launch_form_in_a_new_notebook(page, lab: Lab, name: str):
    """Open an empty notebook with its kernel idle and the sidebar beside it; returns the launch form."""
    _write_notebook(lab, name)
    _open_sidebar(page, lab, f"lab/tree/{name}", reset=True)
    notebook = page.locator(".jp-NotebookPanel:visible .jp-Notebook")
    notebook.wait_for()
    # A narrow toolbar copies its items into a hidden overflow popup, so there can be two
    # indicators and either may be the one shown: wait until any of them says idle.
    page.wait_for_function("""() => [...document.querySelectorAll('.jp-Notebook-ExecutionIndicator')]
        .some(e => e.dataset.status === 'idle')""")
    # Clicked into, as a user would: this notebook is both on screen and last focused, so every
    # rule of the form's targetNotebook picks it (the tests below take those rules apart)
    notebook.locator(".jp-Cell").first.click()
    assert page.locator(".jp-Notebook").count() == 1, "an earlier test's notebook was restored beside this one"
    return page.locator(f"{SIDEBAR} .jp-tpunb-Launch")


@pytest.mark.fresh_slice
def test_the_launch_form_runs_tpu_launch_in_the_active_notebook(lab_home, page, tmp_path):
    form = _launch_form_in_a_new_notebook(page, lab_home, "launch.ipynb")
    form.locator("input[name=accelerator]").fill("v4-8")
    form.locator("select[name=backend]").select_option("local")
    form.locator("button[type=submit]").click()
    card = page.locator(f'{SIDEBAR} [data-slice="v4-8"]')
    card.wait_for()
    assert "running" in card.inner_text()
    cell = page.locator(".jp-Notebook .jp-Cell", has_text="%tpu_launch v4-8 --backend local")
    cell.locator(".jp-OutputArea-output", has_text="ready").wait_for()
    assert cell.locator(".jp-InputArea-editor").inner_text().strip() == "%tpu_launch v4-8 --backend local"
    record = Registry().get_slice("v4-8")
    assert record.owner_pid != os.getpid()  # the notebook's kernel owns it
    pids = [h.info.pid for h in record.hosts]
    _screenshot(page, tmp_path, "sidebar-launch.png")
    _delete_from_sidebar(page, "v4-8")
    assert all(_dead(pid) for pid in pids)


def _notebooks(page) -> dict[str, dict]:
    """Every notebook in the main area: whether it is on screen, and its cells' sources."""
    return page.evaluate("""() => Object.fromEntries([...window.jupyterapp.shell.widgets('main')]
        .filter(w => w.content && w.content.model && w.context)
        .map(w => [w.context.path, {visible: w.isVisible,
                                    cells: w.content.model.sharedModel.cells.map(c => c.getSource())}]))""")


def _launch_v4_8(page, form, tmp_path: Path, shot: str) -> list[int]:
    """Launch a local v4-8 from the form; wait until the notebook on screen shows it ready."""
    form.locator("input[name=accelerator]").fill("v4-8")
    form.locator("select[name=backend]").select_option("local")
    form.locator("button[type=submit]").click()
    shown = page.locator(".jp-NotebookPanel:visible .jp-Cell", has_text="%tpu_launch v4-8 --backend local")
    shown.locator(".jp-OutputArea-output", has_text="ready").wait_for()
    _screenshot(page, tmp_path, shot)
    return [h.info.pid for h in Registry().get_slice("v4-8").hosts]


@pytest.mark.fresh_slice
def test_the_launch_form_runs_in_the_notebook_on_screen_not_a_hidden_tab_last_focused(lab_home, page, tmp_path):
    """A tab restored with the page can be the notebook last focused while another one is shown."""
    form = _launch_form_in_a_new_notebook(page, lab_home, "focused.ipynb")  # clicked into: last focused
    _write_notebook(lab_home, "shown.ipynb")
    page.evaluate("""async () => {
        const app = window.jupyterapp;
        const shown = await app.commands.execute('docmanager:open',
            {path: 'shown.ipynb', options: {mode: 'tab-after', activate: false}});
        await shown.context.ready;
        for (const bar of shown.parent.tabBars()) {  // show its tab without focusing it, as a restore does
            if (bar.titles.includes(shown.title)) { bar.currentTitle = shown.title; }
        }
    }""")
    page.locator(".jp-NotebookPanel:visible").wait_for()
    before = _notebooks(page)
    assert before["shown.ipynb"]["visible"] and not before["focused.ipynb"]["visible"], before
    pids = _launch_v4_8(page, form, tmp_path, "sidebar-launch-shown.png")
    after = _notebooks(page)
    assert after["shown.ipynb"]["cells"][-1] == "%tpu_launch v4-8 --backend local", after
    assert not any("%tpu_launch" in c for c in after["focused.ipynb"]["cells"]), after
    _delete_from_sidebar(page, "v4-8")
    assert all(_dead(pid) for pid in pids)


@pytest.mark.fresh_slice
def test_the_launch_form_brings_the_last_focused_notebook_forward_when_none_is_on_screen(lab_home, page, tmp_path):
    form = _launch_form_in_a_new_notebook(page, lab_home, "behind.ipynb")
    page.evaluate("() => window.jupyterapp.commands.execute('launcher:create')")  # the notebook's tab goes behind
    page.locator(".jp-Launcher:visible").wait_for()
    assert not _notebooks(page)["behind.ipynb"]["visible"]
    pids = _launch_v4_8(page, form, tmp_path, "sidebar-launch-forward.png")
    after = _notebooks(page)
    assert after["behind.ipynb"]["visible"] and after["behind.ipynb"]["cells"][-1] == "%tpu_launch v4-8 --backend local"
    _delete_from_sidebar(page, "v4-8")
    assert all(_dead(pid) for pid in pids)


def test_an_orphaned_cloud_node_shows_in_red_with_its_price_and_can_be_deleted(lab_home, emulator, page, tmp_path,
                                                                                monkeypatch):
    from tpunb.provision.gcp.tpu import api as gcp

    for key, value in _cloud(emulator).items():
        monkeypatch.setenv(key, value)
    gcp.create(gcp.NodeSpec(name="forgotten", accelerator="v4-8", project=PROJECT, zone=ZONE))
    _open_sidebar(page, lab_home)
    card = page.locator(f'{SIDEBAR} .jp-tpunb-orphan[data-slice="forgotten"]')
    card.wait_for()
    text = card.inner_text()
    assert "READY" in text and "Orphan" in text and "still billed" in text
    usd_per_hour = lab_home.api("/tpunb/api/slices")["orphans"][0]["usd_per_hour"]
    assert usd_per_hour > 0 and f"${usd_per_hour:,.2f}/h" in text
    border, error_color = card.evaluate("""card => {
        const probe = document.createElement('div');
        probe.style.color = 'var(--jp-error-color1)';
        document.body.append(probe);
        const red = getComputedStyle(probe).color;
        probe.remove();
        return [getComputedStyle(card).borderLeftColor, red];
    }""")
    assert border == error_color, "an orphan's card is marked in the theme's error colour"
    _screenshot(page, tmp_path, "sidebar-orphan.png")
    _delete_from_sidebar(page, "forgotten")
    assert gcp.get(PROJECT, ZONE, "forgotten") is None


def _host_names(group) -> list[str]:
    return group.locator(".jp-tpunb-HostName").all_inner_texts()


@pytest.mark.fresh_slice
def test_a_multislice_shows_a_group_per_slice_with_hosts_named_as_in_the_notebook(lab_home, page, tmp_path):
    sl = manager.launch("v4-16", name="pair", slices=2, backend="local")
    pids = [h.info["pid"] for h in sl.session.hosts]
    _open_sidebar(page, lab_home)
    card = page.locator(f'{SIDEBAR} [data-slice="pair"]')
    card.wait_for()
    assert card.locator(".jp-tpunb-Accel").inner_text() == "2 x v4-16"
    groups = card.locator(".jp-tpunb-SliceGroup")
    assert groups.count() == 2
    assert [groups.nth(i).locator(".jp-tpunb-SliceHeading").inner_text() for i in range(2)] == ["slice 0", "slice 1"]
    assert [_host_names(groups.nth(i)) for i in range(2)] == [["s0/0", "s0/1"], ["s1/0", "s1/1"]]
    assert card.locator(".jp-tpunb-HostState").all_inner_texts() == ["running"] * 4
    # each host's own metrics reach its row in its slice's group
    _wait_for_memory_bars(page, '[data-slice="pair"] .jp-tpunb-SliceGroup', 4)
    _screenshot(page, tmp_path, "sidebar-multislice.png")
    _delete_from_sidebar(page, "pair")
    assert all(_dead(pid) for pid in pids), "every host of every slice must end"


@pytest.mark.fresh_slice
def test_the_launch_form_checks_slices_and_adds_them_to_the_launch_line(lab_home, page):
    form = _launch_form_in_a_new_notebook(page, lab_home, "multislice.ipynb")
    assert form.locator("input[name=slices]").input_value() == "1"
    form.locator("input[name=accelerator]").fill("v4-8")
    form.locator("select[name=backend]").select_option("local")
    error = form.locator(".jp-tpunb-FormError")
    for bad in ("0", "1.5"):
        form.locator("input[name=slices]").fill(bad)
        form.locator("button[type=submit]").click()
        assert error.inner_text() == (f"slices takes a whole number >= 1 (1: one slice, 2 or more: a multislice), "
                                      f"not '{bad}'")
    form.locator("input[name=slices]").fill("2")
    form.locator("button[type=submit]").click()
    cell = page.locator(".jp-Notebook .jp-Cell", has_text="%tpu_launch")
    cell.locator(".jp-OutputArea-output", has_text="ready").wait_for()
    assert error.inner_text() == ""
    assert cell.count() == 1, "a refused form must not launch anything"
    assert cell.locator(".jp-InputArea-editor").inner_text().strip() == "%tpu_launch v4-8 --backend local --slices 2"
    card = page.locator(f'{SIDEBAR} [data-slice="v4-8-x2"]')  # a multislice's default name
    card.locator(".jp-tpunb-SliceGroup").nth(1).wait_for()  # a poll during the launch may show it without hosts
    assert card.locator(".jp-tpunb-Accel").inner_text() == "2 x v4-8"
    # one host a slice: the notebook names it by its slice alone (Out[s1]), and so does the panel
    assert [_host_names(g) for g in card.locator(".jp-tpunb-SliceGroup").all()] == [["s0"], ["s1"]]
    pids = [h.info.pid for h in Registry().get_slice("v4-8-x2").hosts]
    _delete_from_sidebar(page, "v4-8-x2")
    assert all(_dead(pid) for pid in pids)


@pytest.mark.fresh_slice
def test_the_card_lists_a_service_and_its_forward_link_opens_the_page_through_the_server_proxy(lab_home, page,
                                                                                                tmp_path):
    """Also: a snapshot of the slice is listed below the cards (what it holds, the shape it came
    from, its size, age and folder), from the same JSON."""
    from tpunb.snapshot import snapshot

    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<h1>served from host 1</h1>")
    sl = manager.launch("v4-16", name="served")
    try:
        port, local_port = _free_port(), _free_port()
        sl.serve("web", f"{sys.executable} -m http.server {port} --bind 127.0.0.1 --directory {site}", hosts=[1],
                 wait_port=port)
        sl.serve("once", "exit 3", hosts=[0])
        sl.forward(port, host=1, local_port=local_port)
        sl.run("step, loss = 7, 0.5", output=None).raise_for_status()
        made = snapshot(sl, ["step", "loss"])
        _open_sidebar(page, lab_home)
        card = page.locator(f'{SIDEBAR} [data-slice="served"]')
        web = card.locator('.jp-tpunb-Service[data-service="web"]')
        web.wait_for()
        assert web.inner_text().split() == ["web", "host", f"1:{port}", "ready"]  # the port it answers on
        shot = page.locator(f'{SIDEBAR} .jp-tpunb-Snapshot[data-uri="{made.uri}"]')
        shot.wait_for()
        [listed] = lab_home.api("/tpunb/api/slices")["snapshots"]
        size = shot.locator(".jp-tpunb-SnapshotSize").inner_text()
        assert (shot.locator(".jp-tpunb-SnapshotNames").inner_text(), shot.locator(".jp-tpunb-SnapshotShape").inner_text(),
                shot.get_attribute("data-where")) == ("loss, step", "v4-16 (2 hosts)", "local")
        assert re.fullmatch(r"[0-9.]+ (bytes|KiB)", size) and listed["size_bytes"] > 0, size
        assert re.fullmatch(r"\d+s ago", shot.locator(".jp-tpunb-SnapshotAge").inner_text())
        place = made.uri.split("/")
        assert shot.locator(".jp-tpunb-SnapshotWhere").inner_text() == f"…/{place[-2]}/{place[-1]}"
        assert shot.get_attribute("title") == f"{made.uri} (from served)"
        once = card.locator('.jp-tpunb-Service[data-service="once"]')
        once.wait_for()
        assert once.locator(".jp-tpunb-ServiceState").inner_text() == "exited with code 3"
        assert card.locator(".jp-tpunb-Busy").inner_text() == "service web keeps it busy · $0.00/h (simulated)"
        link = card.locator(".jp-tpunb-ForwardLink")
        assert link.inner_text() == f"host 1:{port}"
        assert link.get_attribute("href") == f"{lab_home.url}/proxy/{local_port}/"  # the lab's base URL, not the kernel's
        _screenshot(page, tmp_path, "sidebar-service.png")
        with page.context.expect_page() as opened:
            link.click()
        served = opened.value
        served.wait_for_load_state()
        assert served.url == f"{lab_home.url}/proxy/{local_port}/"
        assert served.locator("h1").inner_text() == "served from host 1"
    finally:
        manager.down("served")
        shutil.rmtree(lab_home.home / "snapshots", ignore_errors=True)  # the module's lab lists no snapshot after
