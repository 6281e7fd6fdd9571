"""Site side: persistent per-site state and the shared local training loop."""
