"""Thin FLARE glue: server workflow, site entry point, job export."""
