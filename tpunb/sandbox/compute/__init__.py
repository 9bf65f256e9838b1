"""Compute Engine (compute v1): instances, templates, BULK MIGs, project metadata, checked against its schema."""
