"""The method's mathematics in pure torch: no FLARE import here."""
