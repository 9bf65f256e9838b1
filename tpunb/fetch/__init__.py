"""The kernel's side of ``%tpu_fetch``: a SOURCE (``hf://ORG/NAME``, ``gs://BUCKET/PREFIX`` or
``https://...``) made into a manifest, the exact revision and per file its path, size, URL, the
headers its GET needs and how to verify it; the hosts download and verify with
``tpunb.host.fetch``. ``manifest.manifest`` is the one entry point; ``hub``, ``storage`` and
``web`` each list one kind of source; ``source`` holds the records and the ``--include`` rule.
"""
