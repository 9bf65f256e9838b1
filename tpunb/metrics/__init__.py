"""The kernel side of metrics: every host's samples in a bounded ring (``store``), and a feed
thread that publishes the latest values to the registry and wakes the widgets (``feed``)."""
from tpunb.metrics.feed import MetricsFeed
from tpunb.metrics.rings import COLUMNS, MetricsStore

__all__ = ["COLUMNS", "MetricsFeed", "MetricsStore"]
