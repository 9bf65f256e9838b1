"""Execute a notebook in a real kernel and print each cell with what it showed (for the quickstart)."""
from __future__ import annotations

import re
import sys

import nbformat
from nbclient import NotebookClient

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def main(path: str) -> None:
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3").execute()
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        print("\n".join(f">>> {line}" if i == 0 else f"... {line}" for i, line in enumerate(cell.source.splitlines())))
        for output in cell.get("outputs", []):
            if output.output_type == "stream":
                print(output.text, end="")
            elif output.output_type == "error":
                print(ANSI.sub("", "\n".join(output.traceback)))
            else:
                print(output.get("data", {}).get("text/plain", ""))
        print()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "notebooks/01_quickstart.ipynb")
