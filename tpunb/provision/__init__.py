"""Backends that make hosts: one module per backend (local, gcp), the same few functions each."""
