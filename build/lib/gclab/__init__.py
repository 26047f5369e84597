"""gclab: the GraphCast Memory Lab.

A faithful JAX/Haiku implementation of GraphCast (Lam et al., 2023) with the memory
techniques that make its training fit on one accelerator, each behind one switch.
"""

__version__ = "0.1.0"
