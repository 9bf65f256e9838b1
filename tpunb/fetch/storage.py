"""Cloud Storage objects under ``gs://BUCKET/PREFIX`` as a manifest (the JSON API, through
``tpunb.host.gcs``; ``STORAGE_EMULATOR_HOST`` points it at a local server): each object pinned to
the generation listed, verified by its md5, else (composite objects have none) its crc32c.
PREFIX names one object, or a folder whose objects keep their paths below it.

No credential travels in the manifest: a host reads with its VM's own service account (the
metadata server's token, which the server refreshes), as ``gcloud storage`` on the VM would, and
only when that account is refused does it ask the kernel for a token of the kernel's credentials,
one per file (``kernel_token``), which the kernel refreshes when stale."""
from __future__ import annotations

from tpunb.errors import UsageError
from tpunb.fetch.source import Manifest, Source, pick
from tpunb.host import gcs
from tpunb.host.fetch import Entry
from tpunb.machine.cache import cached

#: how a gs:// entry is authorised: the host's own account, else the kernel's token for the file
AUTH = "gcs"


def storage_token() -> str:
    """An access token for Cloud Storage from google-auth's default credentials, refreshed when stale."""
    import google.auth
    import google.auth.transport.requests

    credentials = cached("storage credentials", lambda: google.auth.default(
        scopes=["https://www.googleapis.com/auth/devstorage.read_write"])[0])
    if not credentials.valid:
        credentials.refresh(google.auth.transport.requests.Request())
    return credentials.token


def kernel_token() -> str:
    """A token of the kernel's own credentials (google-auth's default, refreshed when stale), for
    a host whose VM account the bucket refused; UsageError when the kernel has none."""
    try:
        return storage_token()
    except Exception as exc:  # google-auth's errors: no default credentials, a refresh refused
        raise UsageError(f"the bucket refused the hosts' service account and the kernel has no Google credentials "
                         f"to read it with ({type(exc).__name__}): grant the VMs' service account "
                         "roles/storage.objectViewer on the bucket, or run gcloud auth application-default login"
                         ) from None


def list_files(source: Source) -> Manifest:
    """The manifest of ``gs://BUCKET/PREFIX``; one-line UsageError when the bucket cannot be read
    or nothing is under the prefix."""
    name, prefix = gcs.split(source.text)
    bucket = gcs.Bucket(name, token=kernel_token if gcs.endpoint() == gcs.API else None)
    try:
        items = bucket.items(prefix)
    except gcs.GcsError as exc:
        raise UsageError(f"cannot list {source.text}: {exc}") from None
    exact = [item for item in items if item["name"] == prefix]
    folder = prefix + "/" if prefix else ""
    chosen = exact or [item for item in items if item["name"].startswith(folder) and not item["name"].endswith("/")]
    if not chosen:
        raise UsageError(f"nothing is under {source.text}: check the bucket and prefix (gcloud storage ls {source.text})")
    entries = []
    for item in sorted(chosen, key=lambda i: i["name"]):
        path = item["name"].rsplit("/", 1)[-1] if exact else item["name"][len(folder):]
        check, digest = ("md5", item["md5Hash"]) if item.get("md5Hash") else ("crc32c", item.get("crc32c", ""))
        if not digest:
            raise UsageError(f"gs://{name}/{item['name']} has neither md5 nor crc32c: it cannot be verified")
        entries.append(Entry(path, int(item.get("size", 0)), bucket.media_url(item["name"], item.get("generation")),
                             check, digest, {}, AUTH))
    return Manifest(source, None, pick(source, entries))
