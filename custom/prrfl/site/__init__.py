"""Site side: persistent per-site state, the shared local training loop, and the view of a site that
the methods' hooks get."""
