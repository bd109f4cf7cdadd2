"""``kvstab.theory``: closed forms for ``g``, ``E[g]``, ``μ``, ``δ`` and provisioning."""

from kvstab.theory.area import expected_g, g_blocks, g_continuous, g_exact, lifetime_area, mu, mu_per_slot

__all__ = ["g_exact", "g_continuous", "g_blocks", "lifetime_area", "expected_g", "mu", "mu_per_slot"]
