"""Which ``--env`` values are secrets after all. ``--env`` is for settings that may be shown; a
name that says it holds a credential (TOKEN, KEY, SECRET, PASSWORD, CREDENTIAL, AUTH) has its
value masked anyway, with one line saying where a secret belongs: the cell's source (so the
notebook and IPython's history) holds it already."""
from __future__ import annotations

import re

from tpunb import report
from tpunb.engine.masking import MIN_LENGTH, Masker

#: words in a variable's name that say it holds a credential
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "CREDENTIAL", "AUTH")
ENV_HELP = "shown in listings; use --secret or %tpu_secret for secrets"
SECRET_HELP = "an environment variable given to the hosts as a secret: from this kernel, %tpu_secret or a prompt; masked"


def looks_secret(name: str) -> bool:
    """A part of the name (between underscores) is one of SECRET_WORDS, its plural, or ends in one
    (APIKEY, ACCESSTOKEN); AUTHORIZATION too. MODEL, PATH, AUTHOR or MONKEY are not."""
    for part in re.split(r"[^A-Z0-9]+", name.upper()):
        for word in SECRET_WORDS:
            if part in (word, word + "S", "AUTHORIZATION") or (part.endswith(word) and part[:-len(word)] in (
                    "API", "ACCESS", "AUTH", "PRIVATE", "SESSION", "CLIENT", "BEARER", "REFRESH", "ID")):
                return True
    return False


def guard(env: dict[str, str], masker: Masker) -> list[str]:
    """Mask the values of ``env``'s names that look secret and say so in one line; the names."""
    names = sorted(name for name in env if looks_secret(name))
    short = [name for name in names if len(env[name]) < MIN_LENGTH]
    for name in names:
        if name not in short:
            masker.add(env[name])
    if names:
        flags = " ".join(f"--secret {name}" for name in names)
        said = (f"{', '.join(short)} {'are' if len(short) > 1 else 'is'} too short to mask; " if short else "masked, but ")
        report.warn(f"[tpunb] --env {', '.join(names)} look{'s' if len(names) == 1 else ''} secret: {said}the value is "
                    f"in this cell (the notebook, IPython's history): give {flags} or %tpu_secret instead")
    return names
