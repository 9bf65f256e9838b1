"""``manifest(source)``: what a fetch of SOURCE moves, by the kind of source."""
from __future__ import annotations

from tpunb.fetch import hub, storage, web
from tpunb.fetch.source import Manifest, Source, parse_source

_LISTERS = {"hub": hub.list_files, "storage": storage.list_files, "web": web.list_files}


def manifest(source: Source | str, revision: str | None = None, include: tuple[str, ...] | list[str] = ()) -> Manifest:
    """The files of ``source`` (a Source, or SOURCE text with --revision and --include) at its exact
    revision, each with its size, URL, headers and check; one-line UsageError when it cannot be."""
    if isinstance(source, str):
        source = parse_source(source, revision, include)
    return _LISTERS[source.kind](source)
