"""Facilities for kosmos_jax's own tests and benchmarks, not user API: e.g. the
one-GPU loopback runner (`kosmos_jax.testing.loopback`), which runs every rank of
a fused call as a concurrent launch on one GPU."""
