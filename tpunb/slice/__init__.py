"""Slice: a set of hosts with a persistent agent on each; what magics, widgets and users call.

``slice.Slice`` starts, revives, ends and describes its hosts; every verb that works on hosts
(run, push, pull, ...) is ``views.HostsView``'s, which a Slice is (the view of all its hosts) and
``sl[0:2]`` or ``sl.hosts("s1")`` returns; ``cells`` runs a cell; ``node.Node`` is what outlives
the host processes.
"""
from tpunb.slice.node import Node
from tpunb.slice.slice import Slice
from tpunb.slice.views import HostsView

__all__ = ["HostsView", "Node", "Slice"]
