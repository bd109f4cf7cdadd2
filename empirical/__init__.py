"""``kvstab.empirical``: cross-checks against vLLM and batch-time calibration (optional extra)."""
