"""Strict checks of Compute Engine request bodies, and errors in Compute Engine's shape.

Every body is checked against ``compute_schema.json`` (the compute v1 messages as
google-cloud-compute defines them; tests/compute_schema_gen.py writes it): a field the message
lacks is refused, as Google's front end refuses it; an enum value (compute v1's enums travel as
plain strings) must be one the enum has; an int64 is a JSON string of digits (or a number, which
proto3 JSON also accepts); a bool is a bool. Compute Engine's errors carry ``errors[]`` with a
``reason`` and ``domain`` beside ``code`` and ``message`` (not the google.rpc ``status`` the Cloud
TPU API sends)."""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from tpunb.sandbox.tpu.resources import ApiError

SCHEMA_PATH = Path(__file__).with_name("compute_schema.json")
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_INTS = {"int32": 2**31, "uint32": 2**32, "int64": 2**63, "uint64": 2**64}


class ComputeError(ApiError):
    """An error as Compute Engine answers it: ``{"error": {"code", "message", "errors": [...]}}``."""

    def __init__(self, http: int, reason: str, message: str, details: list[dict] | None = None) -> None:
        super().__init__(http, reason, message)
        self.reason = reason
        self.details = details or []  # compute v1 ErrorDetails (a quota's quotaInfo)

    def body(self) -> dict:
        return {"error": {"code": self.http, "message": self.message,
                          "errors": [{"message": self.message, "domain": "global", "reason": self.reason}]}}

    def errors(self) -> dict:
        """The error as compute v1's ``Error`` (an Operation's ``error``, a MIG's bulk progress
        check, a managed instance's last attempt): ``code`` is the reason there."""
        return {"errors": [{"code": self.reason.upper() if self.reason.islower() else self.reason,
                            "message": self.message, **({"errorDetails": self.details} if self.details else {})}]}

    def operation_error(self) -> dict:
        """The same error as an Operation's ``error`` carries it."""
        return self.errors()


def invalid(message: str) -> ComputeError:
    return ComputeError(400, "invalid", message)


def not_found(url: str) -> ComputeError:
    return ComputeError(404, "notFound", f"The resource '{url}' was not found")


def in_use(kind: str, url: str, user: str) -> ComputeError:
    return ComputeError(400, "resourceInUseByAnotherResource",
                        f"The {kind} resource '{url}' is already being used by '{user}'")


@functools.lru_cache(maxsize=1)
def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def check_body(message: str, body: Any, where: str = "resource") -> None:
    """Refuse ``body`` (a JSON object meant as compute v1 ``message``) with Google's 400 when a
    field, enum value or scalar does not fit the message's definition."""
    if not isinstance(body, dict):
        raise invalid(f"Invalid JSON payload received. Expected an object at '{where}'.")
    fields = schema()["messages"][message]
    for name, value in body.items():
        kind = fields.get(name)
        if kind is None:
            raise invalid(f'Invalid JSON payload received. Unknown name "{name}" at \'{where}\': Cannot find field.')
        path = f"{where}.{name}"
        if kind.startswith("[]"):
            if not isinstance(value, list):
                raise invalid(f"Invalid value at '{path}': a list was expected.")
            for i, item in enumerate(value):
                _check_value(kind[2:], item, f"{path}[{i}]")
        elif kind.startswith("map:"):
            if not isinstance(value, dict):
                raise invalid(f"Invalid value at '{path}': an object was expected.")
            for key, item in value.items():
                _check_value(kind[4:], item, f"{path}[{key!r}]")
        else:
            _check_value(kind, value, path)


def _check_value(kind: str, value: Any, path: str) -> None:
    if kind.startswith("enum:"):
        if value not in schema()["enums"][kind[5:]]:
            raise invalid(f"Invalid value at '{path}' (TYPE_ENUM), {json.dumps(value)}")
    elif kind in _INTS:
        digits = value if isinstance(value, str) else str(value) if isinstance(value, int) and not isinstance(value, bool) else ""
        if not re.fullmatch(r"-?\d+", digits) or not -_INTS[kind] <= int(digits) < _INTS[kind]:
            raise invalid(f"Invalid value at '{path}' (TYPE_{kind.upper()}), {json.dumps(value)}")
    elif kind == "bool":
        if not isinstance(value, bool):
            raise invalid(f"Invalid value at '{path}' (TYPE_BOOL), {json.dumps(value)}")
    elif kind in ("double", "float"):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise invalid(f"Invalid value at '{path}' (TYPE_DOUBLE), {json.dumps(value)}")
    elif kind in ("string", "bytes"):
        if not isinstance(value, str):
            raise invalid(f"Invalid value at '{path}' (TYPE_STRING), {json.dumps(value)}")
    else:
        check_body(kind, value, path)


def check_name(name: Any, kind: str) -> str:
    """A resource name as Compute Engine takes it (RFC 1035, at most 63 characters)."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise invalid(f"Invalid value for field 'resource.name': {json.dumps(name)}. Must be a match of regex "
                      "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'")
    return name


def matches(item: dict, filter: str) -> bool:
    """The part of Compute Engine's list filter tpunb uses, terms joined by AND or spaces (quotes
    optional): ``name = X`` / ``!=`` (literal), ``name eq REGEX`` / ``ne`` (a full match),
    ``labels.K:*`` (present), ``description:TEXT`` (contains)."""
    for term in re.findall(r"[\w.-]+\s*(?:=|!=|:|eq|ne)\s*(?:\"[^\"]*\"|'[^']*'|\S+)", filter or ""):
        key, op, value = re.match(r"([\w.-]+)\s*(=|!=|:|eq|ne)\s*(.*)", term).groups()
        value = value.strip("\"'")
        actual: Any = item
        for part in key.split("."):
            actual = actual.get(part) if isinstance(actual, dict) else None
        if op == ":":
            ok = actual is not None and (value == "*" or value in str(actual))
        elif op in ("eq", "ne"):
            ok = re.fullmatch(value, str(actual if actual is not None else "")) is not None
        else:
            ok = str(actual if actual is not None else "") == value
        if ok == (op in ("!=", "ne")):
            return False
    return True
