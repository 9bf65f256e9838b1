"""The kernel's side of the hosts' agents, by job: the connection to one host (``connection``),
frames encoded for many (``frames``), Ctrl-C and a request's inbox (``ctrl_c``), one array from
the shards of a global jax.Array its hosts sent (``gather``), values moved to and from hosts
(``transfer``). ``tpunb.session`` fans requests
out over them."""
