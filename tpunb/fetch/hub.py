"""A Hugging Face Hub repository (a model, or a dataset: ``hf://datasets/ORG/NAME``) as a
manifest, read with the real ``huggingface_hub`` client: the revision resolved to its commit
(repo_info's ``sha``), every file of the tree listing at that commit, LFS files verified by their
sha256 and small ones by their git-blob SHA-1 (each the Hub's ETag, which names the file's blob in
the hub cache), each fetched from ``{endpoint}/{repo id}/resolve/{commit}/{path}``, with the repo id
the Hub answers with (``info.id``: a renamed repository's new name, so no redirect drops the token).
The kernel's ``HF_ENDPOINT`` and token apply, read at each call: ``HF_TOKEN`` (or
``HUGGING_FACE_HUB_TOKEN``), else the one given to ``%tpu_secret``, else the one ``hf auth login`` saved.
"""
from __future__ import annotations

import os
from typing import Callable
from urllib.parse import quote

from tpunb.errors import UsageError
from tpunb.fetch.source import Manifest, Source, download_timeout, pick
from tpunb.host.fetch import Entry

DEFAULT_ENDPOINT = "https://huggingface.co"
TOKEN_HELP = "set HF_TOKEN in the kernel (or %tpu_secret HF_TOKEN) to a token that can read it"
#: the names a Hub token goes by, first to last
TOKEN_NAMES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
#: the URL prefix of a repository of each type (models have none)
URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}


def endpoint() -> str:
    """The Hub this kernel talks to: ``HF_ENDPOINT`` as it is now, else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


#: how a secret given to %tpu_secret or --secret is read: the kernel's manager points it at
#: ``tpunb.manager.secret_value`` when it starts (fetch imports nothing above itself); None: no such secret
secret_lookup: Callable[[str], str | None] = lambda name: None


def kernel_secret(name: str) -> str | None:
    """A secret given to ``%tpu_secret`` or ``--secret`` in this kernel (typed at its prompt, say),
    or None. The one place fetch reads them: where tpunb keeps secrets may move, this function follows."""
    return secret_lookup(name)


def token() -> str | None:
    """The kernel's Hub token: HF_TOKEN (or HUGGING_FACE_HUB_TOKEN) in its environment, else the
    one %tpu_secret was given, else the saved login."""
    for name in TOKEN_NAMES:
        found = (os.environ.get(name) or "").strip()
        if found:
            return found
    for name in TOKEN_NAMES:
        found = (kernel_secret(name) or "").strip()
        if found:
            return found
    from huggingface_hub import get_token

    return get_token()


def list_files(source: Source) -> Manifest:
    """The manifest of ``hf://ORG/NAME`` (``hf://datasets/ORG/NAME``) at ``source.revision``
    (the default branch when None); a one-line UsageError for a missing or private repository, a
    gated one without access, a revision that does not exist, a token the Hub refuses, or
    patterns that take nothing."""
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.hf_api import RepoFile
    except ImportError:
        raise UsageError(f"cannot list {source.text}: huggingface_hub is not installed in the kernel "
                         "(pip install huggingface_hub)") from None
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise UsageError(f"cannot fetch {source.text}: HF_HUB_OFFLINE is set in the kernel (unset it)")
    where, secret = endpoint(), token()
    api = HfApi(endpoint=where, token=secret if secret else False)
    kind = source.repo_type
    try:
        info = api.repo_info(source.location, revision=source.revision, repo_type=kind)
        repo = info.id or source.location  # a renamed repository answers with its new name
        if getattr(info, "gated", False):
            api.auth_check(repo, repo_type=kind, token=secret if secret else False)
        tree = [f for f in api.list_repo_tree(repo, revision=info.sha, recursive=True, repo_type=kind)
                if isinstance(f, RepoFile)]
    except Exception as exc:  # the client's errors, translated; its text may quote a URL, never the token
        raise _translated(exc, source, where, bool(secret)) from None
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    base = f"{where}/{URL_PREFIX.get(kind, '')}{repo}"
    entries = [_entry(base, info.sha, f, headers) for f in sorted(tree, key=lambda f: f.path)]
    return Manifest(source, info.sha, pick(source, entries), download_timeout(), repo, kind,
                    source.revision or "main", {f.path: _tree_record(f) for f in tree})


def _entry(base: str, commit: str, found, headers: dict) -> Entry:
    url = f"{base}/resolve/{commit}/{quote(found.path)}"
    if found.lfs is not None:
        return Entry(found.path, found.size, url, "sha256", found.lfs.sha256, dict(headers))
    return Entry(found.path, found.size, url, "git-sha1", found.blob_id, dict(headers))


def _tree_record(found) -> dict:
    """A file's record in huggingface_hub's tree cache (``_tree_cache.TreeCacheEntry.to_json``)."""
    record = {"size": found.size, "blob_id": found.blob_id}
    if found.lfs is not None:
        record.update(lfs_sha256=found.lfs.sha256, lfs_size=found.lfs.size)
    xet = getattr(found, "xet_hash", None)
    if xet:
        record["xet_hash"] = xet
    return record


def _translated(exc: Exception, source: Source, where: str, has_token: bool) -> Exception:
    """The client's error as one line naming the cause and what to do."""
    import httpx2
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, HFValidationError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    name = source.text
    if isinstance(exc, HFValidationError):
        return UsageError(f"{name} is not a valid repository name: give hf://ORG/NAME or hf://datasets/ORG/NAME")
    if isinstance(exc, GatedRepoError):
        if has_token:
            return UsageError(f"{name} is gated and this token has no access: ask for access at {where}/"
                              f"{URL_PREFIX.get(source.repo_type, '')}{source.location}, or use a token of an "
                              "account that has it")
        return UsageError(f"{name} is gated and the kernel has no Hugging Face token: {TOKEN_HELP}")
    if isinstance(exc, RevisionNotFoundError):
        return UsageError(f"{name} has no revision {source.revision!r}: give a branch, tag or commit that exists "
                          "(--revision)")
    if isinstance(exc, RepositoryNotFoundError):
        if has_token:
            return UsageError(f"{name} is not at {where}, or this token cannot see it: check the name and the token")
        return UsageError(f"{name} is not at {where}, or it is private: check the name, or {TOKEN_HELP}")
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        if status == 401:
            return UsageError(f"the Hub at {where} refused the kernel's Hugging Face token (invalid credentials): "
                              "check HF_TOKEN")
        return UsageError(f"the Hub at {where} answered HTTP {status} listing {name}: try again later")
    if isinstance(exc, (OSError, httpx2.HTTPError)):
        return UsageError(f"cannot reach the Hub at {where} to list {name} ({type(exc).__name__}): check HF_ENDPOINT "
                          "and the network")
    return exc
