"""A second cloud backend's face, as a GKE backend would show it to %tpu_launch: its own ``project``,
``zone`` and ``spot`` options, the names Cloud TPU's flags have too. It is registered and parsed,
never launched (creating hosts is not what these tests are about)."""
from __future__ import annotations

import dataclasses

from tpunb.errors import UsageError

NAME = "second"
CAPABILITIES = frozenset({"flags"})


@dataclasses.dataclass
class SecondOptions:
    project: str | None = dataclasses.field(default=None, metadata={"flag": True, "help": "its project"})
    zone: str | None = dataclasses.field(default=None, metadata={"flag": True, "help": "its zone"})
    spot: bool = dataclasses.field(default=False, metadata={"flag": True, "help": "spot capacity"})


def options(**given) -> SecondOptions:
    return SecondOptions(**given)


def option_flags() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(SecondOptions) if f.metadata.get("flag")]


def create(request):
    raise UsageError("the second cloud makes no hosts in the tests")


def attach(record, registry, env):
    raise UsageError("the second cloud attaches no hosts in the tests")


def delete(record) -> None:
    return None
