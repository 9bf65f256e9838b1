"""The agent's half of values in and out of a host's namespace: a pushed value arriving (in the
request's frame, from the kernel's memfd, in parts read straight into its buffer, or by relay from a
peer), and the replies of pull and gather (in one frame, in a memfd lent to the kernel, or in parts an
interrupt stops). A mixin of ``agent.Agent``: the ops are its ``op_push``, ``op_relay_push``,
``op_pull`` and ``op_gather``.

Shipped to hosts: standard library only."""
from __future__ import annotations

import os
import pickle

from . import shards, transfer
from .relay import RelayError


class ValueExchange:
    """Ops on values for an agent that has ``send``, ``runner``, ``inbox``, ``relay``, ``arriving``
    (the parts of the value being pushed), ``lent`` (memfds lent to the kernel) and ``interrupt_for``."""

    def _take_part(self, message: dict, blob) -> None:
        assembly = self._assembly(message)
        if assembly is not None:
            assembly.add(message["at"], blob)

    def _assembly(self, message: dict):
        """Where a part of a pushed value goes (the first part starts it: one at a time)."""
        rid = message.get("id")
        if "sizes" in message and rid not in self.arriving:
            self.arriving = {rid: transfer.Assembly(message["sizes"])}
        return self.arriving.get(rid)

    def _place(self, message: dict, blob_len: int):
        """Where a large part's bytes are read to: straight into its value's buffer."""
        if message.get("op") != "part":
            return None
        assembly = self._assembly(message)
        return assembly.place(message["at"], blob_len) if assembly is not None else None

    def _arrived(self, message: dict, blob: bytes):
        """The pushed value: in the request's blob, from the kernel's memfd, or from part frames."""
        if message.get("inline") and len(message["sizes"]) == 1:  # one pickle, its arrays in band
            return pickle.loads(blob)
        if message.get("inline"):  # arrays out of band: laid out in a buffer of our own (writable)
            return transfer.loads(transfer.views(bytearray(blob), message["sizes"]))
        if "shm" in message:
            return transfer.loads(transfer.map_memfd(*message["shm"], message["sizes"]))
        assembly = self.arriving.pop(message["id"], None)
        if assembly is None or not assembly.complete:
            raise ValueError("the value did not arrive whole: push it again")
        return transfer.loads(assembly.segments())

    def op_push(self, message: dict, blob: bytes) -> None:
        try:
            self._set_then_answer(message, self._arrived(message, blob))
        except OSError as exc:  # the kernel's memfd could not be mapped here: it sends parts instead
            self.send({"op": "done", "id": message["id"], "status": "error", "error": f"{type(exc).__name__}: {exc}",
                       **({"unshared": True} if "shm" in message else {})})
        except Exception as exc:
            self.send({"op": "done", "id": message["id"], "status": "error", "error": f"{type(exc).__name__}: {exc}"})

    def _set_then_answer(self, message: dict, values: dict) -> None:
        """Set pushed names, answer, and only then let go of the values they replace: freeing a
        large one (unmapping a memfd the kernel lent, 64 MB of pages) took 15-20 ms of a 64 MB
        push's 100 on 4 local hosts, and the kernel need not wait for it."""
        namespace = self.runner.namespace
        replaced = [namespace[name] for name in values if name in namespace]
        namespace.update(values)
        self.send({"op": "done", "id": message["id"], "status": "ok"})
        del replaced

    def op_relay_push(self, message: dict, blob: bytes) -> None:
        """A pushed value that comes by relay (tpunb_host.relay): the root got it as parts and
        streams it to its children; the others wait for it from their parent."""
        try:
            self.inbox.cell_started()  # a relay_cancel that comes meanwhile is read beside this
            try:
                if message.get("tree") is not None:  # a root: its stripe came as parts
                    try:
                        self.relay.send_tree(self._relay_buffer(message), message["tree"], message["id"],
                                             message["me"], message.get("stripe"), int(message.get("stripes", 1)))
                    except BaseException:
                        self.relay.forget(message["id"])
                        raise
                buffer = self.relay.wait(message["id"], float(message.get("wait", 60.0)))
            finally:
                self.inbox.cell_ended()
            self._set_then_answer(message, transfer.loads(transfer.views(buffer, message["sizes"])))
        except Exception as exc:  # RelayError names the peer; anything else in one line too
            error = str(exc) if isinstance(exc, RelayError) else f"{type(exc).__name__}: {exc}"
            self.send({"op": "done", "id": message["id"], "status": "error", "error": error})

    def _relay_buffer(self, message: dict) -> bytearray:
        """The root's copy of a relayed value, laid out as ``transfer.join`` does."""
        if "shm" in message:  # a host on the kernel's machine (TPUNB_RELAY=always)
            return transfer.join(transfer.map_memfd(*message["shm"], message["sizes"]))
        assembly = self.arriving.pop(message["id"], None)
        if assembly is None or assembly.received < message.get("want", assembly.total):
            raise ValueError("the value did not arrive whole: push it again")
        return assembly.buffer

    def op_pull(self, message: dict, blob: bytes) -> None:
        namespace = self.runner.namespace
        missing = [name for name in message["names"] if name not in namespace]
        if missing:
            self.send({"op": "done", "id": message["id"], "status": "error",
                       "error": f"NameError: {', '.join(missing)} not defined on this host"})
            return
        self._send_value(message, {name: namespace[name] for name in message["names"]}, ", ".join(message["names"]))

    def op_gather(self, message: dict, blob: bytes) -> None:
        """This host's distinct shards of a global jax.Array, for the notebook to assemble."""
        name = message["name"]
        if name not in self.runner.namespace:
            self.send({"op": "done", "id": message["id"], "status": "error",
                       "error": f"NameError: {name} not defined on this host"})
            return
        try:
            part = shards.owned(self.runner.namespace[name])
        except Exception as exc:
            self.send({"op": "done", "id": message["id"], "status": "error", "error": f"{name}: {exc}"})
            return
        self._send_value(message, part, name)

    def _send_value(self, message: dict, value, what: str) -> None:
        """``value`` as the reply to ``message`` (a memfd the kernel maps when it shares this
        machine, else part frames an interrupt stops), or say why it cannot travel."""
        rid = message["id"]
        try:
            segments = transfer.dumps(value, _pickler().Pickler)
        except Exception as exc:
            self.send({"op": "done", "id": rid, "status": "error",
                       "error": f"cannot send {what} back: {type(exc).__name__}: {exc}"})
            return
        sizes = [len(s) for s in segments]
        stop = lambda: self.interrupt_for == rid  # noqa: E731 (an interrupt frame sets it)
        reply = {"op": "done", "id": rid, "status": "ok", "sizes": sizes}
        if sum(sizes) <= transfer.INLINE:  # one frame
            self.send({**reply, "inline": True}, transfer.join(segments))
            return
        self.inbox.cell_started()  # frames (an interrupt) are read while this sends
        try:
            fd = self._lend(segments, stop) if message.get("shm") and transfer.can_share() else None
            if fd is not None:
                reply["shm"] = [os.getpid(), fd]
            else:
                for at, piece in transfer.pieces(segments):
                    if stop():
                        break
                    self.send({"op": "part", "id": rid, "at": at, **({"sizes": sizes} if at == 0 else {})}, piece)
        finally:
            self.inbox.cell_ended()
        if stop():
            if "shm" in reply:
                self.lent.discard(reply["shm"][1])
                os.close(reply["shm"][1])
            reply = {"op": "done", "id": rid, "status": "interrupted"}
        self.send(reply)

    def _lend(self, segments: list, stop) -> int | None:
        """A memfd holding the value for the kernel to map (None: send parts). Requests come one at
        a time, so memfds lent before this one were mapped (or given up) already."""
        for fd in self.lent:
            os.close(fd)
        self.lent.clear()
        try:
            fd = transfer.write_memfd(segments, stop)
        except OSError:  # no memfd to be had (memory, fds): parts still work
            return None
        if fd is not None:
            self.lent.add(fd)
        return fd


def _pickler():
    """cloudpickle when the host has it (functions and classes defined in cells), else pickle."""
    try:
        import cloudpickle

        return cloudpickle
    except ImportError:
        return pickle
