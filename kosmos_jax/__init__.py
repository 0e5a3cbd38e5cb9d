"""kosmos_jax"""
