"""Where a fetch puts files so that Hugging Face's own tools find them on the host, in
huggingface_hub's exact layouts (read from its file_download.py, _local_folder.py, constants.py
and _tree_cache.py):

- the hub cache (``%tpu_fetch hf://ORG/NAME`` without ``--to``): found as huggingface_hub finds
  it from the host's environment (``HF_HUB_CACHE``, ``HUGGINGFACE_HUB_CACHE``, ``HF_HOME/hub``,
  ``$XDG_CACHE_HOME/huggingface/hub``, ``~/.cache/huggingface/hub``), the repository in
  ``models--ORG--NAME`` (``datasets--``...): each file once in ``blobs/<etag>``,
  ``snapshots/<commit>/<path>`` a relative symlink to it, ``refs/<revision>`` holding the commit,
  and the commit's listing in ``trees/<commit>.json``; ``from_pretrained("ORG/NAME")``,
  ``snapshot_download`` and ``vllm serve ORG/NAME`` then find it, offline too;
- a local dir (``--to PATH``), as ``hf download --local-dir PATH`` leaves it: each file's
  ``.cache/huggingface/download/<path>.metadata`` (commit, etag, time), written after the file's
  final rename, so huggingface_hub neither downloads nor hashes it again.

Shipped to hosts: standard library only (see the package docstring).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

#: how huggingface_hub names a repository's folder: ``{type}s--{org}--{name}``
SEPARATOR = "--"
#: what huggingface_hub writes in a cache it made (the Cache Directory Tagging Standard)
CACHEDIR_TAG = ("Signature: 8a477f597d28d172789f06886806bc55\n"
                "# This file is a cache directory tag created by huggingface_hub.\n"
                "# For information about cache directory tags, see:\n"
                "#\thttps://bford.info/cachedir/\n")
#: the tree cache's format (``_tree_cache.TREE_CACHE_FORMAT_VERSION``)
TREE_FORMAT = 1


def _expand(path: str) -> str:
    return os.path.expandvars(os.path.expanduser(path))


def hub_cache() -> str:
    """The hub cache of this process, as huggingface_hub's constants resolve it (the same
    fallbacks, in the same order, each expanded as it expands them)."""
    default_home = os.path.join(os.path.expanduser("~"), ".cache")
    hf_home = _expand(os.getenv("HF_HOME", os.path.join(os.getenv("XDG_CACHE_HOME", default_home), "huggingface")))
    legacy = os.getenv("HUGGINGFACE_HUB_CACHE", os.path.join(hf_home, "hub"))
    return _expand(os.getenv("HF_HUB_CACHE", legacy))


def repo_folder(repo_type: str, repo_id: str) -> str:
    """``models--ORG--NAME`` (``datasets--``, ``spaces--``): huggingface_hub's repo_folder_name."""
    return SEPARATOR.join([f"{repo_type}s", *repo_id.split("/")])


def root_of(place: dict) -> str:
    """Where a fetch's files go on this host: ``{"path": PATH}`` (~ is this host's home),
    ``{"hf_cache": FOLDER}``, the repository's folder in this host's hub cache, or
    ``{"jax_cache": FOLDER}``, a folder in this host's JAX compilation cache."""
    if place.get("hf_cache"):
        return os.path.join(hub_cache(), place["hf_cache"])
    if place.get("jax_cache"):
        from .jaxcache import local_dir

        where = local_dir()
        if where is None:
            raise OSError("the JAX compilation cache is not on this host's disk")
        return os.path.join(where, place["jax_cache"])
    return os.path.abspath(os.path.expanduser(place["path"]))


def _write_atomic(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, kept = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tpunb-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(kept, path)
    except BaseException:
        try:
            os.unlink(kept)
        except OSError:
            pass
        raise


def _tag(folder: str) -> None:
    tag = os.path.join(folder, "CACHEDIR.TAG")
    if not os.path.exists(tag):
        try:
            _write_atomic(tag, CACHEDIR_TAG)
        except OSError:
            pass


def _tree(folder: str, commit: str, tree: dict) -> None:
    """``trees/<commit>.json``: the commit's whole listing, as snapshot_download caches it (a
    later snapshot_download then skips the listing, and knows when a snapshot is incomplete)."""
    if tree:
        body = {"format_version": TREE_FORMAT, "files": {path: tree[path] for path in sorted(tree)}}
        _write_atomic(os.path.join(folder, "trees", f"{commit}.json"), json.dumps(body, indent=1))


def _link(blob: str, pointer: str) -> None:
    """``pointer`` a symlink to ``blob``, relative (as huggingface_hub makes them); a copy where
    the file system has no symlinks."""
    os.makedirs(os.path.dirname(pointer), exist_ok=True)
    relative = os.path.relpath(blob, os.path.dirname(pointer))
    if os.path.islink(pointer) and os.readlink(pointer) == relative:
        return
    try:
        os.unlink(pointer)
    except OSError:
        pass
    try:
        os.symlink(relative, pointer)
    except OSError:
        shutil.copyfile(blob, pointer)


def finish(root: str, layout: dict) -> None:
    """After every file of the fetch is in place under ``root``: what Hugging Face's tools read
    beside the files (nothing for a plain folder). ``layout``: ``{"kind": "hf-cache" | "local-dir",
    "commit", "ref", "tree", "files": [[repo path, entry path, etag], ...]}``."""
    kind = layout.get("kind")
    commit = layout.get("commit") or ""
    if kind == "hf-cache":
        _tag(os.path.dirname(root))
        for path, stored, _ in layout.get("files") or ():
            _link(os.path.join(root, *stored.split("/")), os.path.join(root, "snapshots", commit, *path.split("/")))
        ref = layout.get("ref")
        if ref and ref != commit:
            ref_path = os.path.join(root, "refs", *ref.split("/"))
            try:
                with open(ref_path) as kept:
                    same = kept.read() == commit
            except OSError:
                same = False
            if not same:
                _write_atomic(ref_path, commit)  # no newline: huggingface_hub reads it whole
        _tree(root, commit, layout.get("tree") or {})
    elif kind == "local-dir":
        folder = os.path.join(root, ".cache", "huggingface")
        os.makedirs(folder, exist_ok=True)
        _tag(folder)
        if not os.path.exists(os.path.join(folder, ".gitignore")):
            _write_atomic(os.path.join(folder, ".gitignore"), "*")
        for path, _, etag in layout.get("files") or ():
            metadata = os.path.join(folder, "download", *path.split("/")) + ".metadata"
            # after the file's final rename: read_download_metadata trusts it while mtime - 1 <= time
            _write_atomic(metadata, f"{commit}\n{etag}\n{time.time()}\n")
        _tree(folder, commit, layout.get("tree") or {})
