"""A Hugging Face Hub repository as a manifest, read with the real ``huggingface_hub`` client:
the revision resolved to its commit (model_info's ``sha``), every file of the tree listing at that
commit, LFS files verified by their sha256 and small ones by their git-blob SHA-1, each fetched
from ``{endpoint}/{repo}/resolve/{commit}/{path}``. The kernel's ``HF_ENDPOINT``, ``HF_HUB_*``
settings and token (``HF_TOKEN``, else the one ``hf auth login`` saved) apply, read at each call.
"""
from __future__ import annotations

import os
from urllib.parse import quote

from tpunb.errors import UsageError
from tpunb.fetch.source import Manifest, Source, hub_settings, pick
from tpunb.host.fetch import Entry

DEFAULT_ENDPOINT = "https://huggingface.co"
TOKEN_HELP = "set HF_TOKEN in the kernel (or %tpu_secret HF_TOKEN) to a token that can read it"


def endpoint() -> str:
    """The Hub this kernel talks to: ``HF_ENDPOINT`` as it is now, else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def token() -> str | None:
    """The kernel's Hub token: HF_TOKEN (or HUGGING_FACE_HUB_TOKEN), else the saved login."""
    found = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if found:
        return found.strip() or None
    from huggingface_hub import get_token

    return get_token()


def list_files(source: Source) -> Manifest:
    """The manifest of ``hf://ORG/NAME`` at ``source.revision`` (the default branch when None);
    a one-line UsageError for a missing or private repository, a gated one without access, a
    revision that does not exist, a token the Hub refuses, or an --include that takes nothing."""
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
    repo = source.location
    try:
        info = api.model_info(repo, revision=source.revision)
        if info.gated:
            api.auth_check(repo, token=secret if secret else False)
        tree = [f for f in api.list_repo_tree(repo, revision=info.sha, recursive=True) if isinstance(f, RepoFile)]
    except Exception as exc:  # the client's errors, translated; its text may quote a URL, never the token
        raise _translated(exc, source, where, bool(secret)) from None
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    entries = [_entry(where, repo, info.sha, f, headers) for f in sorted(tree, key=lambda f: f.path)]
    return Manifest(source, info.sha, pick(source, entries), hub_settings())


def _entry(where: str, repo: str, commit: str, found, headers: dict) -> Entry:
    url = f"{where}/{repo}/resolve/{commit}/{quote(found.path)}"
    if found.lfs is not None:
        return Entry(found.path, found.size, url, "sha256", found.lfs.sha256, dict(headers))
    return Entry(found.path, found.size, url, "git-sha1", found.blob_id, dict(headers))


def _translated(exc: Exception, source: Source, where: str, has_token: bool) -> Exception:
    """The client's error as one line naming the cause and what to do."""
    import httpx2
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, HFValidationError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    name = source.text
    if isinstance(exc, HFValidationError):
        return UsageError(f"{name} is not a valid repository name: give hf://ORG/NAME")
    if isinstance(exc, GatedRepoError):
        if has_token:
            return UsageError(f"{name} is gated and this token has no access: ask for access at {where}/"
                              f"{source.location}, or use a token of an account that has it")
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
