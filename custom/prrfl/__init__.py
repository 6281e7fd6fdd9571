"""prrfl: personalized retrogress-resilient federated learning on NVIDIA FLARE."""

__version__ = "0.1.0"
