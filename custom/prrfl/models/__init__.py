"""Networks. Every model returns (logits, embedding) so prototype-based methods can use any of them."""

from prrfl.models.vgg import SlimVGG16BN

__all__ = ["SlimVGG16BN"]
