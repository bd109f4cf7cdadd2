"""``kvstab.proofs``: z3 proofs and refutations of scheduler invariants."""
