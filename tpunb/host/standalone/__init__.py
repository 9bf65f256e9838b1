"""Programs that run on a host by themselves, each one file: standard library only and no
relative imports (checked by tests/test_layout.py), since each runs with nothing beside it.

``idle.py`` is a node's startup-script and the idle watchdog process, and is also shipped with
the agent (as ``tpunb_host.standalone.idle``), which arms and touches it; ``service.py`` is the
service control program and supervisor, sent with each request to a short-lived process
(``tpunb.services.control``)."""
