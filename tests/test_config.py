"""Fused-kernel knobs (kosmos_jax.kernel_config): validation that names the values, and the
closed-form crew rules (their measurements are in the module docstring)."""
import pytest

from kosmos_jax import kernel_config as config


def test_crew_rules_follow_the_measured_table():
  assert config.ag_movers(1280) == config.CREW_THIN and config.ag_movers(3072) == config.CREW_DEFAULT
  assert config.rs_reducers(512) == config.CREW_THIN and config.rs_reducers(3584) == config.CREW_DEFAULT
  assert config.ag_movers(config.AG_THIN_N) == config.CREW_THIN  # the boundaries are inclusive
  assert config.rs_reducers(config.RS_THIN_K) == config.CREW_THIN


def test_rs_reducers_shrink_with_a_cu_cap():
  # Paper §3.1.2: a capped grid shrinks both roles in proportion.
  assert config.rs_reducers(512, 66, 132) == config.CREW_THIN // 2
  assert config.rs_reducers(3584, 33, 132) == config.CREW_DEFAULT // 4
  assert config.rs_reducers(512, 1, 132) == 1  # never below one
  assert config.rs_reducers(512, 200, 132) == config.rs_reducers(512, None, 132) == config.CREW_THIN
  assert config.rs_reducers(512, 66, None) == config.CREW_THIN  # SM count unknown: unscaled


@pytest.mark.parametrize("kw,match", [
    (dict(cu_cap=0), "cu_cap=0"),
    (dict(movers=-1), "movers=-1"),
    (dict(switching=1), "switching=1"),
    (dict(transport="nvls"), "transport='nvls'"),
    (dict(transport="push_fold"), "transport='push_fold'"),  # a GEMM+RS transport
])
def test_ag_config_rejects(kw, match):
  with pytest.raises(ValueError, match=match):
    config.AgConfig(**kw)


@pytest.mark.parametrize("kw,match", [
    (dict(reducers=-2), "reducers=-2"),
    (dict(cu_cap=True), "cu_cap=True"),
    (dict(stage="fp16"), "stage='fp16'"),
    (dict(switching=False, reducers=0), "nobody to reduce"),
    (dict(band_rows=0), "band_rows=0"),
    (dict(band_rows=65), "band_rows=65"),
    (dict(band_rows=2.0), "band_rows=2.0"),
    (dict(transport="multicast"), "transport='multicast'"),
    (dict(transport="push_fold", stage="fp32"), "stage='fp32'"),
    (dict(transport="push_fold", switching=False), "switching=False"),
    (dict(transport="push_fold", reducers=4), "reducers=4"),
])
def test_rs_config_rejects(kw, match):
  with pytest.raises(ValueError, match=match):
    config.RsConfig(**kw)


def test_defaults_are_valid():
  assert config.RsConfig().stage is None and config.RsConfig().switching  # None: by the input dtype
  assert config.RsConfig(band_rows=8).band_rows == 8 and config.rs_band_rows(16384, 6656) == 8 and config.rs_band_rows(8192, 1024) == 1
  assert config.AgConfig(movers=0, switching=False).movers == 0
  assert config.AgConfig().transport == "pull" and config.AgConfig(transport="push").transport == "push"
  assert config.RsConfig(transport="push_fold", reducers=0).transport == "push_fold"
  # The names csrc/fused_run.h parses from the `transport` attribute, and only names.
  assert config.TRANSPORTS == ("pull", "push") and config.RS_TRANSPORTS == ("pull", "push", "push_fold")
  assert not hasattr(config, "RS_PUSH_ATTR")
