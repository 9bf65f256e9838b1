"""What runs on every host: the agent and the modules shipped with it, and the standalone
programs hosts run by themselves (``standalone/``).

STANDARD LIBRARY ONLY, and nothing from the rest of tpunb: every module here is shipped over the
transport (``tpunb.transport.bundle``) to hosts that may not have tpunb installed, where they live as
the package ``tpunb_host``; they import each other relatively, and never outside this folder.
The kernel imports some of them too (the frame format, value layout, version checks).
"""
