"""sync_tree over SFTP to a real sshd's 4 hosts; each host gets its own directory on this machine."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tpunb.errors import TransportError
from tpunb.transport.sync import MANIFEST, scan, sync_tree


@pytest.fixture
def tree(tmp_path) -> Path:
    src = tmp_path / "src"
    files = {
        "train.py": "print('train')\n",
        "run.sh": "#!/bin/sh\necho run\n",
        "pkg/__init__.py": "",
        "pkg/model.py": "W = 1\n",
        "pkg/deep/er/leaf.txt": "leaf\n",
        "data/big.bin": "x" * 200_000,
        "notes.log": "ignored by root .gitignore\n",
        "keep.log": "re-included by a negation\n",
        "build/out.o": "ignored directory\n",
        "pkg/.gitignore": "secret.txt\n!keep.log\n",
        "pkg/secret.txt": "ignored by the nested .gitignore\n",
        "pkg/deep/debug.log": "ignored: a root pattern applies below\n",
        ".git/HEAD": "never synced\n",
        "scratch/tmp.txt": "excluded with --exclude\n",
        "cache.tmp": "excluded with --exclude\n",
    }
    for rel, text in files.items():
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (src / ".gitignore").write_text("*.log\n!keep.log\nbuild/\n")
    os.chmod(src / "run.sh", 0o755)
    return src


EXCLUDE = ["scratch/", "*.tmp"]
EXPECTED = {".gitignore", "train.py", "run.sh", "pkg/__init__.py", "pkg/model.py", "pkg/deep/er/leaf.txt",
            "data/big.bin", "keep.log", "pkg/.gitignore"}


def remote_files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != MANIFEST}


def destinations(tmp_path: Path, transports) -> list[Path]:
    return [tmp_path / "hosts" / t.host / "work" for t in transports]


def test_scan_honours_gitignore_nesting_negation_and_excludes(tree):
    assert {f.rel for f in scan(tree, EXCLUDE)} == EXPECTED
    assert "scratch/tmp.txt" in {f.rel for f in scan(tree)}


def test_first_sync_copies_the_tree_to_every_host_with_modes_and_mtimes(tree, transports, tmp_path):
    dests = destinations(tmp_path, transports)
    calls = []
    report = sync_tree(transports, tree, [str(d) for d in dests], exclude=EXCLUDE,
                       progress=lambda done, total: calls.append((done, total)))
    total = sum(len((tree / rel).read_bytes()) for rel in EXPECTED)
    assert report.files == len(EXPECTED)
    assert report.files_sent == 4 * len(EXPECTED) and report.bytes_sent == 4 * total
    assert calls[-1] == (4 * total, 4 * total)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)
    for dest in dests:
        assert remote_files(dest) == EXPECTED
        for rel in EXPECTED:
            local, remote = tree / rel, dest / rel
            assert remote.read_bytes() == local.read_bytes()
            assert int(remote.stat().st_mtime) == int(local.stat().st_mtime)
        assert stat.S_IMODE((dest / "run.sh").stat().st_mode) == 0o755


def test_resync_sends_only_what_changed(tree, transports, tmp_path):
    dests = [str(d) for d in destinations(tmp_path, transports)]
    sync_tree(transports, tree, dests, exclude=EXCLUDE)
    again = sync_tree(transports, tree, dests, exclude=EXCLUDE)
    assert again.files_sent == 0 and all(h.unchanged == len(EXPECTED) for h in again.hosts)

    # same size, same second: only the manifest's nanosecond mtime can tell
    model = tree / "pkg" / "model.py"
    st = model.stat()
    model.write_text("W = 2\n")
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    (tree / "new.py").write_text("new\n")
    (tree / "pkg" / "deep" / "er" / "leaf.txt").unlink()
    report = sync_tree(transports, tree, dests, exclude=EXCLUDE)
    assert [h.sent for h in report.hosts] == [2] * 4
    assert [h.deleted for h in report.hosts] == [1] * 4
    for dest in map(Path, dests):
        assert (dest / "pkg/model.py").read_text() == "W = 2\n"
        assert (dest / "new.py").read_text() == "new\n"
        assert not (dest / "pkg/deep/er/leaf.txt").exists()


def test_changes_made_on_a_host_are_repaired(tree, transports, tmp_path):
    dests = destinations(tmp_path, transports)
    sync_tree(transports, tree, [str(d) for d in dests])
    (dests[0] / "train.py").write_text("edited on the host, longer than before\n")
    (dests[1] / "pkg" / "model.py").unlink()
    report = sync_tree(transports, tree, [str(d) for d in dests])
    assert [h.sent for h in report.hosts] == [1, 1, 0, 0]
    assert (dests[0] / "train.py").read_text() == (tree / "train.py").read_text()
    assert (dests[1] / "pkg" / "model.py").exists()


def test_files_now_excluded_are_left_alone_not_deleted(tree, transports, tmp_path):
    dests = destinations(tmp_path, transports)
    sync_tree(transports, tree, [str(d) for d in dests])
    report = sync_tree(transports, tree, [str(d) for d in dests], exclude=["data/"])
    assert report.files_sent == 0 and all(h.deleted == 0 for h in report.hosts)
    assert all((d / "data" / "big.bin").exists() for d in dests)
    manifest = json.loads((dests[0] / MANIFEST).read_text())
    assert "data/big.bin" not in manifest["files"]


def test_a_broken_manifest_means_a_full_resend(tree, transports, tmp_path):
    dests = destinations(tmp_path, transports)
    sync_tree(transports, tree, [str(d) for d in dests])
    (dests[2] / MANIFEST).write_text("{not json")
    report = sync_tree(transports, tree, [str(d) for d in dests])
    assert [h.sent for h in report.hosts] == [0, 0, report.files, 0]


def test_hosts_may_share_one_directory(tree, transports, tmp_path):
    shared = tmp_path / "shared"
    sync_tree(transports, tree, str(shared), exclude=EXCLUDE)
    assert remote_files(shared) == EXPECTED
    assert sync_tree(transports, tree, str(shared), exclude=EXCLUDE).files_sent == 0


def test_a_host_that_cannot_write_is_named_and_the_others_complete(tree, transports, tmp_path):
    dests = destinations(tmp_path, transports)
    dests[3].parent.mkdir(parents=True)
    dests[3].write_text("a file where the directory should be")
    with pytest.raises(TransportError) as info:
        sync_tree(transports, tree, [str(d) for d in dests])
    assert str(info.value).startswith("sync failed on 1 of 4 hosts")
    assert transports[3].address in str(info.value) and "cannot create directory" in str(info.value)
    assert all(remote_files(d) == {f.rel for f in scan(tree)} for d in dests[:3])


def test_local_dir_must_exist(transports, tmp_path):
    with pytest.raises(TransportError, match="not a directory"):
        sync_tree(transports, tmp_path / "missing", "x")


def test_an_interrupted_sync_stops_at_once_and_the_next_one_completes(transports, tmp_path):
    src = tmp_path / "big"
    src.mkdir()
    for i in range(4):
        (src / f"part{i}.bin").write_bytes(os.urandom(4_000_000))
    dests = [str(d) for d in destinations(tmp_path, transports)]
    seen = []

    def progress(done, total):
        seen.append(done)
        raise KeyboardInterrupt  # what Ctrl-C does in the thread that drives the progress bar

    with pytest.raises(KeyboardInterrupt):
        sync_tree(transports, src, dests, progress=progress)
    assert seen and seen[0] < 4 * 16_000_000
    report = sync_tree(transports, src, dests)
    assert report.files_sent > 0
    for dest in map(Path, dests):
        assert all((dest / p.name).read_bytes() == p.read_bytes() for p in src.iterdir())
