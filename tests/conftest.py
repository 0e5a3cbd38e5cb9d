"""CPU tests run over 8 virtual devices; set before JAX initialises its backends."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", os.environ.get("KOSMOS_TEST_PLATFORMS", "cpu"))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
