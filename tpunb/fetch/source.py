"""What a fetch reads (``Source``) and what it found there (``Manifest``), and how ``--include``
and ``--exclude`` globs pick files (as huggingface_hub's ``allow_patterns`` and
``ignore_patterns``: fnmatch, a pattern ending in "/" takes the folder). A manifest's headers hold
tokens: they stay in its entries (never in a repr)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from fnmatch import fnmatch

from tpunb.errors import UsageError
from tpunb.host.fetch import Entry
from tpunb.secrets import urls

#: the kinds of source, by their scheme
SCHEMES = {"hf://": "hub", "gs://": "storage", "https://": "web", "http://": "web"}
#: hf://datasets/ORG/NAME: a repository of another type than a model (HfFileSystem's paths)
REPO_TYPES = {"datasets": "dataset", "spaces": "space"}


@dataclass(frozen=True)
class Source:
    """A SOURCE as given: its kind (hub, storage, web), where it is, and what to take of it."""

    text: str
    kind: str
    location: str  # ORG/NAME, BUCKET/PREFIX or the URL
    revision: str | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    #: a Hub repository's type: model, dataset or space
    repo_type: str = "model"

    @property
    def shown(self) -> str:
        """The source as messages show it: a URL without its query (a signed URL's signature)."""
        return urls.bare(self.text)


@dataclass
class Manifest:
    """The files of one source at one exact revision (the Hub's commit sha, else None)."""

    source: Source
    revision: str | None
    entries: list[Entry] = field(default_factory=list)
    #: seconds a host's connection to the source may stay silent (the kernel's HF_HUB_DOWNLOAD_TIMEOUT)
    timeout: float | None = None
    #: a Hub repository's id as the Hub names it now (a renamed one's new name), its type, the
    #: revision asked for (refs/<it> in the hub cache) and each listed file's tree record
    repo_id: str | None = None
    repo_type: str = "model"
    ref: str | None = None
    tree: dict[str, dict] = field(default_factory=dict, repr=False)

    @property
    def total(self) -> int:
        """Bytes of every file."""
        return sum(entry.size for entry in self.entries)

    def __str__(self) -> str:
        at = f"@{self.revision[:12]}" if self.revision else ""
        return f"{self.source.shown}{at}: {len(self.entries)} files, {self.total:,} bytes"


def parse_source(text: str, revision: str | None = None, include: tuple[str, ...] | list[str] = (),
                 exclude: tuple[str, ...] | list[str] = ()) -> Source:
    """SOURCE (and --revision, --include, --exclude) as a Source; UsageError (one line) for anything else."""
    text = (text or "").strip()
    shown = urls.bare(text)  # a presigned URL's query is a credential
    kind = next((k for scheme, k in SCHEMES.items() if text.startswith(scheme)), None)
    if kind is None:
        raise UsageError(f"cannot fetch {shown or 'nothing'!r}: give hf://ORG/NAME, gs://BUCKET/PREFIX or https://...")
    if revision is not None and kind != "hub":
        raise UsageError(f"--revision is for hf:// sources only: {shown} has one version (drop --revision)")
    location = text if kind == "web" else text.split("://", 1)[1].strip("/")
    repo_type = "model"
    if kind == "hub":
        parts = location.split("/")
        if len(parts) > 1 and parts[0] in REPO_TYPES:
            repo_type, parts = REPO_TYPES[parts[0]], parts[1:]
            location = "/".join(parts)
        if not 1 <= len(parts) <= 2 or not all(parts) or any(p in (".", "..") for p in parts) or "@" in location:
            raise UsageError(f"{text} is not a Hub repository: give hf://ORG/NAME or hf://datasets/ORG/NAME (the "
                             "revision with --revision)")
    if kind == "storage" and not location:
        raise UsageError(f"{text} names no bucket: give gs://BUCKET/PREFIX")
    return Source(text, kind, location, revision, tuple(p for p in include if p), tuple(p for p in exclude if p),
                  repo_type)


def _pattern(glob: str) -> str:
    glob = glob.replace("\\", "/")
    return glob + "*" if glob.endswith("/") else glob


def matches(path: str, include: tuple[str, ...], exclude: tuple[str, ...] = ()) -> bool:
    """Whether ``path`` is taken (huggingface_hub's filter_repo_objects): one an include pattern
    matches (every path without any), and no exclude pattern."""
    if include and not any(fnmatch(path, _pattern(glob)) for glob in include):
        return False
    return not any(fnmatch(path, _pattern(glob)) for glob in exclude)


def pick(source: Source, entries: list[Entry]) -> list[Entry]:
    """The entries ``--include`` and ``--exclude`` take; UsageError naming the patterns and a few
    paths when none is."""
    picked = [entry for entry in entries if matches(entry.path, source.include, source.exclude)]
    if entries and not picked:
        sample = ", ".join(entry.path for entry in entries[:4]) + (", ..." if len(entries) > 4 else "")
        said = [f"--{name} {' '.join(globs)}" for name, globs in (("include", source.include), ("exclude", source.exclude))
                if globs]
        raise UsageError(f"{' '.join(said)} match{'es' if len(said) == 1 else ''} none of the {len(entries)} files of "
                         f"{source.shown} ({sample}): fix the pattern")
    return picked


def download_timeout() -> float | None:
    """The kernel's HF_HUB_DOWNLOAD_TIMEOUT (seconds a download's connection may stay silent), if set."""
    try:
        return float(os.environ["HF_HUB_DOWNLOAD_TIMEOUT"])
    except (KeyError, ValueError):
        return None
