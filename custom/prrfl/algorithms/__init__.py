"""The method's mathematics in pure torch: no FLARE import here.

pfa               Progressive Fourier Aggregation (server): per-site spectral mix of the deputies' weights.
det               Deputy-Enhanced Transfer (site): the Recover / Exchange / Sublimate phases and the KL term.
cpa               Conjoint Prototype-Aligned loss (site): conjoint mask G, modified softmax, prototype gamma.
class_prototypes  per-class mean embeddings (site) and the sampled Gaussian global prototype (server).

Defaults follow the TMI 2022 paper; each material difference of the authors' code is a named
option (see docs/authors_code.md).
"""
