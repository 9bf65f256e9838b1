"""What a fetch reads (``Source``) and what it found there (``Manifest``), and how ``--include``
globs pick files (as huggingface_hub's ``allow_patterns``: fnmatch, a pattern ending in "/" takes
the folder). A manifest's headers hold tokens: they stay in its entries (never in a repr)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from fnmatch import fnmatch

from tpunb.errors import UsageError
from tpunb.host.fetch import Entry

#: the kinds of source, by their scheme
SCHEMES = {"hf://": "hub", "gs://": "storage", "https://": "web", "http://": "web"}
#: the kernel's Hugging Face settings that apply wherever the download runs (HF_TOKEN travels apart)
HUB_SETTINGS = ("HF_ENDPOINT",)
HUB_PREFIX = "HF_HUB_"


@dataclass(frozen=True)
class Source:
    """A SOURCE as given: its kind (hub, storage, web), where it is, and what to take of it."""

    text: str
    kind: str
    location: str  # ORG/NAME, BUCKET/PREFIX or the URL
    revision: str | None = None
    include: tuple[str, ...] = ()


@dataclass
class Manifest:
    """The files of one source at one exact revision (the Hub's commit sha, else None)."""

    source: Source
    revision: str | None
    entries: list[Entry] = field(default_factory=list)
    #: settings the hosts' downloads need (HF_ENDPOINT, HF_HUB_*): no secrets
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Bytes of every file."""
        return sum(entry.size for entry in self.entries)

    def __str__(self) -> str:
        at = f"@{self.revision[:12]}" if self.revision else ""
        return f"{self.source.text.split('?', 1)[0]}{at}: {len(self.entries)} files, {self.total:,} bytes"


def parse_source(text: str, revision: str | None = None, include: tuple[str, ...] | list[str] = ()) -> Source:
    """SOURCE (and --revision, --include) as a Source; UsageError (one line) for anything else."""
    text = (text or "").strip()
    shown = text.split("?", 1)[0]  # a presigned URL's query is a credential
    kind = next((k for scheme, k in SCHEMES.items() if text.startswith(scheme)), None)
    if kind is None:
        raise UsageError(f"cannot fetch {shown or 'nothing'!r}: give hf://ORG/NAME, gs://BUCKET/PREFIX or https://...")
    if revision is not None and kind != "hub":
        raise UsageError(f"--revision is for hf:// sources only: {shown} has one version (drop --revision)")
    location = text if kind == "web" else text.split("://", 1)[1].strip("/")
    if kind == "hub":
        parts = location.split("/")
        if not 1 <= len(parts) <= 2 or not all(parts) or any(p in (".", "..") for p in parts) or "@" in location:
            raise UsageError(f"{text} is not a model repository: give hf://ORG/NAME (the revision with --revision)")
    if kind == "storage" and not location:
        raise UsageError(f"{text} names no bucket: give gs://BUCKET/PREFIX")
    patterns = tuple(p for p in include if p)
    return Source(text, kind, location, revision, patterns)


def _pattern(glob: str) -> str:
    glob = glob.replace("\\", "/")
    return glob + "*" if glob.endswith("/") else glob


def matches(path: str, include: tuple[str, ...]) -> bool:
    """Whether ``path`` is taken: every path when there are no patterns, else one that a pattern matches."""
    return not include or any(fnmatch(path, _pattern(glob)) for glob in include)


def pick(source: Source, entries: list[Entry]) -> list[Entry]:
    """The entries ``--include`` takes; UsageError naming the patterns and a few paths when none is."""
    picked = [entry for entry in entries if matches(entry.path, source.include)]
    if entries and not picked:
        sample = ", ".join(entry.path for entry in entries[:4]) + (", ..." if len(entries) > 4 else "")
        raise UsageError(f"--include {' '.join(source.include)} matches none of the {len(entries)} files of "
                         f"{source.text.split('?', 1)[0]} ({sample}): fix the pattern")
    return picked


def hub_settings() -> dict[str, str]:
    """The kernel's HF_ENDPOINT and HF_HUB_* settings, to apply where the download runs."""
    return {k: v for k, v in os.environ.items() if k in HUB_SETTINGS or k.startswith(HUB_PREFIX)}
