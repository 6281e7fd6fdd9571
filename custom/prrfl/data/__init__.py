"""Data sets: real-layout loaders, preparation and synthetic generators."""
