"""Backends that live in the tests: registered the way another package's would be (``tpunb.backends``
entry points, ``$TPUNB_BACKENDS``), to show that registering one touches no file of tpunb's."""
