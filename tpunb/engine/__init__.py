"""The kernel's side of the hosts' agents, by job: one request to N hosts and the one wait loop
(``request``), the routes a request takes to its hosts (``routes``: a frame, a value's parts, a
memfd, relay stripes), the connection to one host (``connection``), frames encoded for many
(``frames``), Ctrl-C and a request's inbox (``ctrl_c``), values moved to and from hosts
(``transfer``), pushes relayed among the hosts (``relay``), one array from the shards of a global
jax.Array its hosts sent (``gather``); programs run on hosts beside the agent (``programs``:
service control, stacks from outside, the log follow); a cell held for a slice (``cell``).
``session`` owns the hosts and makes the requests; work on many hosts outside a request is
``tpunb.transport.fanout``."""
