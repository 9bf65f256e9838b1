"""tpunb's own SSH user key: one ed25519 key made on first use under $TPUNB_HOME/keys.

A key of tpunb's own means connecting never depends on ~/.ssh or an ssh-agent, and the public
line can be handed to the provisioner (instance metadata ``ssh-keys``) or to a user who adds it
to a host's authorized_keys. The private key file is 0600 in a 0700 directory, always.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from tpunb.errors import TransportError
from tpunb.registry import tpunb_home

if TYPE_CHECKING:
    import paramiko

KEY_NAME = "id_ed25519"


def keys_dir() -> Path:
    """$TPUNB_HOME/keys, created owner-only (and tightened if it exists looser)."""
    path = tpunb_home() / "keys"
    path.mkdir(mode=0o700, exist_ok=True)
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def default_key() -> tuple[Path, str]:
    """(private key path, public OpenSSH line) of tpunb's user key, generating it once."""
    directory = keys_dir()
    private = directory / KEY_NAME
    if not private.exists():
        _generate(private)
    if private.stat().st_mode & 0o077:
        os.chmod(private, 0o600)
    return private, public_line(private)


def public_line(private_path: str | os.PathLike) -> str:
    """The ``ssh-ed25519 AAAA... comment`` line for a private key file (read from .pub if present)."""
    private_path = Path(private_path).expanduser()
    pub = private_path.with_name(private_path.name + ".pub")
    if pub.exists():
        return pub.read_text().strip()
    key = load_private_key(private_path)
    return f"{key.get_name()} {key.get_base64()}"


def load_private_key(key_path: str | os.PathLike | None = None) -> paramiko.PKey:
    """The paramiko key in ``key_path`` (any type paramiko reads), or tpunb's own key if None."""
    import paramiko  # lazily: `import tpunb` must stay fast

    path = Path(key_path).expanduser() if key_path else default_key()[0]
    try:
        return paramiko.PKey.from_path(str(path))
    except FileNotFoundError:
        raise TransportError(f"SSH key {path} does not exist: pass the path of a private key file") from None
    except paramiko.PasswordRequiredException:
        raise TransportError(f"SSH key {path} is passphrase-protected: give tpunb an unencrypted key") from None
    except (paramiko.SSHException, ValueError, OSError) as exc:
        raise TransportError(f"cannot read SSH key {path} ({exc}): pass an OpenSSH private key file") from None


def _generate(private: Path) -> None:
    """Write a new key pair; safe against two kernels generating at the same moment."""
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                            serialization.NoEncryption())
    comment = f"tpunb@{socket.gethostname()}"
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    tmp = private.with_name(f".{private.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub_tmp = tmp.with_name(tmp.name + ".pub")
    pub_tmp.write_text(f"{public.decode()} {comment}\n")
    try:
        os.link(tmp, private)  # atomic and fails if another process won the race: keep theirs
        os.replace(pub_tmp, private.with_name(private.name + ".pub"))
    except FileExistsError:
        pub_tmp.unlink(missing_ok=True)
    finally:
        tmp.unlink(missing_ok=True)
