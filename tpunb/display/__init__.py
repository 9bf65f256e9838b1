"""Rendering per-host output for notebooks: how hosts are named and picked (``hosts``), and their
live labelled lines, collapsed values and logs (``output``)."""
from tpunb.display.hosts import HostNames, Layout, format_hosts
from tpunb.display.sink import OutputSink
from tpunb.display.output import (ANSI, DEFAULT_CAP_BYTES, DEFAULT_CAP_LINES, LINE_CHARS, MODES, CellOutput,
                                  HostLogs, HostsProgress, LineMerger, LineSplitter, LiveLines, kernel_cell_number,
                                  kernel_colors, render_values)

__all__ = ["ANSI", "DEFAULT_CAP_BYTES", "DEFAULT_CAP_LINES", "LINE_CHARS", "MODES", "CellOutput", "HostLogs",
           "HostNames", "HostsProgress", "Layout", "LineMerger", "LineSplitter", "LiveLines", "OutputSink", "format_hosts",
           "kernel_cell_number", "kernel_colors", "render_values"]
