"""What runs on every host: the agent and the modules shipped with it.

STANDARD LIBRARY ONLY, and nothing from the rest of tpunb: these modules are shipped over the
transport (see ``bundle``) to hosts that may not have tpunb installed, where they live as the
package ``tpunb_host``; they import each other relatively. ``bundle`` and ``procs`` are the
exceptions: they run in the kernel (procs also in the server and emulator) and are never shipped.
"""
