"""Rendering per-host output for notebooks: how hosts are named and picked (``hosts``), a cell's
live labelled output and logs (``output``, from ``lines``), stragglers (``progress``), values
(``values``), and what the kernel says and shows (``kernel``)."""
from tpunb.display.hosts import HostNames, Layout, format_hosts
from tpunb.display.kernel import kernel_cell_number, kernel_colors
from tpunb.display.lines import LineMerger, LineSplitter, LiveLines
from tpunb.display.output import ANSI, DEFAULT_CAP_BYTES, DEFAULT_CAP_LINES, LINE_CHARS, MODES, CellOutput, HostLogs
from tpunb.display.progress import HostsProgress
from tpunb.display.sink import LogOnly, OutputSink
from tpunb.display.values import render_values

__all__ = ["ANSI", "DEFAULT_CAP_BYTES", "DEFAULT_CAP_LINES", "LINE_CHARS", "MODES", "CellOutput", "HostLogs", "LogOnly",
           "HostNames", "HostsProgress", "Layout", "LineMerger", "LineSplitter", "LiveLines", "OutputSink", "format_hosts",
           "kernel_cell_number", "kernel_colors", "render_values"]
