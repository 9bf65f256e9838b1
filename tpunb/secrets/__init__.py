"""The kernel's secrets, apart from the slices that use them: the values named with ``%tpu_secret``
or ``--secret`` (``store``: memory only, never the registry; the kernel's ``SliceManager`` holds
them and ``tpunb.manager.secret_value(name)`` reads one), which ``--env`` names look secret
(``policy``), the Hugging Face token's way to new slices (``hub_token``), and URLs printed without
the credentials in their query (``urls``). The masking of their values in what hosts send back is
the engine's (``tpunb/engine/masking.py``)."""
