"""``manifest(source)``: what a fetch of SOURCE moves, by the kind of source."""
from __future__ import annotations

from tpunb.errors import UsageError
from tpunb.fetch import hub, storage, web
from tpunb.fetch.source import Manifest, Source, parse_source

_LISTERS = {"hub": hub.list_files, "storage": storage.list_files, "web": web.list_files}


def manifest(source: Source | str, revision: str | None = None, include: tuple[str, ...] | list[str] = (),
             exclude: tuple[str, ...] | list[str] = ()) -> Manifest:
    """The files of ``source`` (a Source, or SOURCE text with --revision, --include and --exclude)
    at its exact revision, each with its size, URL, headers and check; one-line UsageError when
    it cannot be."""
    if isinstance(source, str):
        source = parse_source(source, revision, include, exclude)
    return _LISTERS[source.kind](source)


def wanted(source: str, to: str | None, include=(), revision: str | None = None, exclude=()) -> tuple[Source, str | None]:
    """A fetch's arguments as given to ``Slice.fetch`` (a glob or a list of them), checked: the
    Source, and where the files go (None: a Hub repository to each host's Hugging Face cache)."""
    if to is not None and (not isinstance(to, str) or not to.strip()):
        raise UsageError("say where the files go on the hosts: --to PATH, e.g. --to ~/models/gemma (or no --to: "
                         "a Hub repository goes to each host's Hugging Face cache)")

    def globs(value) -> tuple[str, ...]:
        return (value,) if isinstance(value, str) else tuple(value or ())

    found = parse_source(source, revision, globs(include), globs(exclude))
    if to is None and found.kind != "hub":
        raise UsageError(f"say where the files of {found.shown} go on the hosts: --to PATH (only hf:// "
                         "repositories go to the Hugging Face cache by default)")
    return found, to.strip() if to is not None else None
