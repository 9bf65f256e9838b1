"""ipywidgets views of tpunb's models. They render; they never fetch or own state."""
