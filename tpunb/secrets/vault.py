"""Secret values this kernel was given by name: ``%tpu_secret NAME`` or ``--secret NAME``, each
from the kernel's environment, Colab's secrets or a prompt that echoes nothing. They live in this
process's memory only (the kernel's ``SliceManager`` holds its ``Secrets``) and are masked from the
moment they are known. ``tpunb.manager.secret_value(name)`` is how other parts read one
(``%tpu_fetch`` reads HF_TOKEN's when the environment has none)."""
from __future__ import annotations

import getpass
import os
import re

from tpunb import colab
from tpunb.engine.masking import MIN_LENGTH, Masker
from tpunb.errors import UsageError

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Secrets:
    """name -> value, for this kernel only."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def value(self, name: str) -> str | None:
        return self.values.get(name)

    def get(self, name: str, masker: Masker, flag: str = "%tpu_secret") -> str:
        """The value of ``name``: given before in this kernel, else its environment, Colab's
        secrets, or a prompt; refused in one line when too short to mask. It is masked from now on."""
        if not NAME.fullmatch(name or ""):
            raise UsageError(f"{flag} {name!r}: not an environment variable name (letters, digits and _)")
        found = (self.values.get(name) or os.environ.get(name) or colab.user_secret(name)
                 or getpass.getpass(f"{name} (not shown): "))
        if len(found) < MIN_LENGTH:
            raise UsageError(f"{name} has {len(found)} character{'s' if len(found) != 1 else ''}: a secret needs at "
                             f"least {MIN_LENGTH}, or masking it would hide ordinary text (pass it with --env)")
        masker.add(found)
        self.values[name] = found
        return found

    def forget(self) -> None:
        self.values.clear()
