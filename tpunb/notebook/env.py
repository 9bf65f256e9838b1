"""The values a slice's hosts get in their environment: --env settings (which may be shown, and
are never stored) and --secret names (whose values come from this kernel and are masked)."""
from __future__ import annotations

from tpunb import report
from tpunb.engine.masking import Masker
from tpunb.errors import UsageError
from tpunb.secrets import policy
from tpunb.secrets.vault import Secrets


def parse_env(pairs: list[str] | dict | None, secrets: list[str] | None, masker: Masker,
              named: Secrets) -> dict[str, str]:
    """['KEY=VALUE', ...] -> dict; a name that looks secret is masked with a hint
    (``tpunb.secrets.policy``). ``secrets``: names whose values ``named`` gives (%tpu_secret, the
    kernel's environment, Colab's secrets or a prompt), masked from then on."""
    env = {}
    if isinstance(pairs, dict):
        env = {str(k): str(v) for k, v in pairs.items()}
    for pair in [] if isinstance(pairs, dict) else pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"--env takes KEY=VALUE, got {key or pair!r}")
        env[key] = value
    policy.guard(env, masker)
    env.update({name: named.get(name, masker, "--secret") for name in secrets or []})
    return env


def note_unset(env_keys: list[str], values: dict[str, str], what: str) -> None:
    """One warning naming the --env keys a slice had that this kernel no longer has values for."""
    missing = [k for k in env_keys if k not in values]
    if missing:
        report.warn(f"[tpunb] --env values are never stored, so {', '.join(missing)} are not set on the hosts "
                    f"now: {what}")
