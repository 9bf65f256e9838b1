"""A small SFTP v3 server on stdin/stdout, for hosts reached without SSH (an exec channel).

It answers what tpunb's sync sends (``tpunb.transport.sftp``): open, read, write, close, stat,
lstat, fsetstat, mkdir, remove, rename and posix-rename@openssh.com, in order, as OpenSSH's
sftp-server does, with paths relative to the home directory. Standard library only: the host's
Python runs this file's text (``python3 -S -c``), nothing of tpunb is installed there.
"""
import os
import struct
import sys

INIT, VERSION, OPEN, CLOSE, READ, WRITE, LSTAT = 1, 2, 3, 4, 5, 6, 7
FSETSTAT, REMOVE, MKDIR, STAT, RENAME, EXTENDED = 10, 13, 14, 17, 18, 200
STATUS, HANDLE, DATA, ATTRS_REPLY = 101, 102, 103, 105
OK, EOF, NO_SUCH_FILE, PERMISSION_DENIED, FAILURE, UNSUPPORTED = 0, 1, 2, 3, 4, 8
ATTR_SIZE, ATTR_UIDGID, ATTR_PERMISSIONS, ATTR_TIMES, ATTR_EXTENDED = 0x1, 0x2, 0x4, 0x8, 0x80000000
FLAGS = ((0x8, os.O_CREAT), (0x10, os.O_TRUNC), (0x20, os.O_EXCL), (0x4, os.O_APPEND))


class Failed(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def int(self):
        self.pos += 4
        return struct.unpack_from("!I", self.data, self.pos - 4)[0]

    def long(self):
        self.pos += 8
        return struct.unpack_from("!Q", self.data, self.pos - 8)[0]

    def bytes(self):
        n = self.int()
        self.pos += n
        return self.data[self.pos - n:self.pos]

    def path(self):
        return os.fsdecode(self.bytes()) or "."

    def attrs(self):
        flags, got = self.int(), {}
        if flags & ATTR_SIZE:
            got["size"] = self.long()
        if flags & ATTR_UIDGID:
            self.pos += 8
        if flags & ATTR_PERMISSIONS:
            got["mode"] = self.int() & 0o7777
        if flags & ATTR_TIMES:
            got["times"] = (self.int(), self.int())
        if flags & ATTR_EXTENDED:
            for _ in range(self.int()):
                self.bytes()
                self.bytes()
        return got


def string(data):
    return struct.pack("!I", len(data)) + data


def attrs_of(st):
    return struct.pack("!IQIIIII", ATTR_SIZE | ATTR_UIDGID | ATTR_PERMISSIONS | ATTR_TIMES, st.st_size, st.st_uid,
                       st.st_gid, st.st_mode, int(st.st_atime), int(st.st_mtime))


class Server:
    def __init__(self):
        self.handles, self.next = {}, 0

    def fd(self, handle):
        try:
            return self.handles[handle]
        except KeyError:
            raise Failed(FAILURE, "no such handle") from None

    def setstat(self, fd, got):
        if "size" in got:
            os.ftruncate(fd, got["size"])
        if "mode" in got:
            os.fchmod(fd, got["mode"])
        if "times" in got:
            os.utime(fd, got["times"])

    def answer(self, kind, r):
        """The reply's type and body (after the request id); OSError and Failed become a STATUS."""
        if kind == OPEN:
            path, pflags, got = r.path(), r.int(), r.attrs()
            access = {1: os.O_RDONLY, 2: os.O_WRONLY, 3: os.O_RDWR}.get(pflags & 3, os.O_RDONLY)
            flags = access | sum(flag for bit, flag in FLAGS if pflags & bit)
            fd = os.open(path, flags, got.get("mode", 0o666))
            self.next += 1
            handle = b"%d" % self.next
            self.handles[handle] = fd
            return HANDLE, string(handle)
        if kind == CLOSE:
            os.close(self.handles.pop(r.bytes(), -1))
        elif kind == READ:
            fd, offset, length = self.fd(r.bytes()), r.long(), r.int()
            data = os.pread(fd, min(length, 1 << 18), offset)
            if not data:
                raise Failed(EOF, "end of file")
            return DATA, string(data)
        elif kind == WRITE:
            fd, offset, data = self.fd(r.bytes()), r.long(), r.bytes()
            view = memoryview(data)
            while view:
                view = view[os.pwrite(fd, view, offset + len(data) - len(view)):]
        elif kind in (STAT, LSTAT):
            path = r.path()
            return ATTRS_REPLY, attrs_of(os.stat(path) if kind == STAT else os.lstat(path))
        elif kind == FSETSTAT:
            fd = self.fd(r.bytes())
            self.setstat(fd, r.attrs())
        elif kind == MKDIR:
            path, got = r.path(), r.attrs()
            os.mkdir(path, got.get("mode", 0o777))
        elif kind == REMOVE:
            os.remove(r.path())
        elif kind == RENAME:
            old, new = r.path(), r.path()
            if os.path.lexists(new):
                raise Failed(FAILURE, "the target exists")
            os.rename(old, new)
        elif kind == EXTENDED and r.bytes() == b"posix-rename@openssh.com":
            os.rename(r.path(), r.path())
        else:
            raise Failed(UNSUPPORTED, "operation not supported")
        return STATUS, struct.pack("!I", OK) + string(b"") + string(b"")


def status(code, message):
    return STATUS, struct.pack("!I", code) + string(message.encode(errors="replace")) + string(b"")


def reply_to(server, packet):
    """The whole reply packet to one request packet."""
    kind = packet[0]
    if kind == INIT:
        return string(struct.pack("!BI", VERSION, 3) + string(b"posix-rename@openssh.com") + string(b"1"))
    (request_id,) = struct.unpack_from("!I", packet, 1)
    try:
        reply, payload = server.answer(kind, Reader(packet[5:]))
    except Failed as exc:
        reply, payload = status(exc.code, str(exc))
    except FileNotFoundError as exc:
        reply, payload = status(NO_SUCH_FILE, exc.strerror or "no such file")
    except PermissionError as exc:
        reply, payload = status(PERMISSION_DENIED, exc.strerror or "permission denied")
    except (OSError, struct.error, ValueError) as exc:
        reply, payload = status(FAILURE, getattr(exc, "strerror", None) or str(exc))
    return string(struct.pack("!BI", reply, request_id) + payload)


def serve(fd_in=0, fd_out=1):
    """Answer requests in order until the input ends; the replies to what arrived together go out together."""
    server, buf = Server(), bytearray()
    while True:
        chunk = os.read(fd_in, 1 << 20)
        if not chunk:
            return
        buf += chunk
        out, pos = bytearray(), 0
        while len(buf) - pos >= 4 and len(buf) - pos >= 4 + struct.unpack_from("!I", buf, pos)[0]:
            length = struct.unpack_from("!I", buf, pos)[0]
            out += reply_to(server, bytes(buf[pos + 4:pos + 4 + length]))
            pos += 4 + length
        del buf[:pos]
        view = memoryview(out)
        while view:
            view = view[os.write(fd_out, view):]


if __name__ == "__main__":
    os.chdir(os.path.expanduser("~"))
    serve()
    sys.exit(0)
