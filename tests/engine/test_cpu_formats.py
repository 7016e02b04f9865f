"""The CPU plan (instrumented_engine/model/cpu_formats.py) as a pure function of the capability,
injected: every branch runs on every host, whatever its own CPU."""
from __future__ import annotations

import pytest
import torch

from instrumented_engine.model.cpu_formats import (CpuCapability, CpuFormatError, LowBit,
                                                   plan_cpu)

AVX512_BF16 = CpuCapability(isa="AVX512", avx512_bf16=True, onednn=True)
AVX512_NO_BF16 = CpuCapability(isa="AVX512", avx512_bf16=False, onednn=True)   # Skylake-SP
AVX2 = CpuCapability(isa="AVX2", avx512_bf16=False, onednn=True)                # Zen 3
AVX2_CAPPED = CpuCapability(isa="AVX2", avx512_bf16=True, onednn=True)   # ATEN_CPU_CAPABILITY=avx2
PORTABLE = CpuCapability(isa="DEFAULT", avx512_bf16=False, onednn=True)
NO_ONEDNN = CpuCapability(isa="AVX2", avx512_bf16=False, onednn=False)


HEAD = (LowBit("int8", 4),)
AVX2_FORMATS = ("q4_1", "int4", "fp32")


@pytest.mark.parametrize("capability, path, dtype, formats, head, attention", [
    (AVX512_BF16, "avx512_bf16", torch.bfloat16, ("q4_1", "int4", "bf16"), HEAD, torch.bfloat16),
    (AVX512_NO_BF16, "avx2", torch.bfloat16, AVX2_FORMATS, HEAD, torch.float32),
    (AVX2, "avx2", torch.bfloat16, AVX2_FORMATS, HEAD, torch.float32),
    (AVX2_CAPPED, "avx2", torch.bfloat16, AVX2_FORMATS, HEAD, torch.float32),
    (PORTABLE, "portable", torch.float32, ("dense",), (), torch.float32),
    (NO_ONEDNN, "portable", torch.float32, ("dense",), (), torch.float32),
])
def test_auto_plan_follows_the_capability(capability, path, dtype, formats, head, attention):
    plan = plan_cpu(capability)
    assert (plan.path, plan.dtype, plan.weight_formats, plan.head, plan.attention_dtype) == (
        path, dtype, formats, head, attention)
    assert plan.fused_ops == (path != "portable")
    assert plan.describe()["cpu_capability"] == capability.isa


@pytest.mark.parametrize("capability", [AVX2, AVX512_NO_BF16, PORTABLE, NO_ONEDNN])
def test_bf16_gemm_is_refused_without_avx512_bf16_and_the_message_says_what_to_use(capability):
    with pytest.raises(CpuFormatError) as refused:
        plan_cpu(capability, weight_format="bf16")
    message = str(refused.value)
    assert "AVX-512 BF16" in message and capability.isa in message
    assert "--weight-format auto" in message and "dense" in message


def test_fp32_gemm_needs_onednn():
    with pytest.raises(CpuFormatError, match="oneDNN"):
        plan_cpu(NO_ONEDNN, weight_format="fp32")
    assert plan_cpu(PORTABLE, weight_format="fp32").weight_formats == ("fp32",)


@pytest.mark.parametrize("capability", [AVX512_BF16, AVX2, PORTABLE])
@pytest.mark.parametrize("forced", ["fp32", "dense"])
def test_a_forced_dense_format_serves_every_step(capability, forced):
    plan = plan_cpu(capability, weight_format=forced)
    assert plan.weight_formats == (forced,) and plan.layers == () and plan.head == ()


def test_another_dtype_is_the_reference_path_unless_a_weight_format_is_forced_too():
    plan = plan_cpu(AVX512_BF16, dtype="fp32")
    assert plan.dtype == torch.float32 and plan.weight_formats == ("dense",)
    assert not plan.fused_ops and plan.attention_dtype == torch.float32
    assert plan_cpu(AVX512_BF16, dtype="fp32", weight_format="fp32").weight_formats == ("fp32",)
    same = plan_cpu(AVX2, dtype="bf16")
    assert same == plan_cpu(AVX2)
    slow_but_runs = plan_cpu(PORTABLE, dtype="bf16")
    assert slow_but_runs.dtype == torch.bfloat16 and slow_but_runs.weight_formats == ("dense",)


@pytest.mark.parametrize("kwargs, match", [({"weight_format": "int3"}, "unknown weight format"),
                                           ({"dtype": "fp8"}, "unknown dtype")])
def test_unknown_names_are_refused(kwargs, match):
    with pytest.raises(CpuFormatError, match=match):
        plan_cpu(AVX2, **kwargs)


def test_weight_only_tiers_go_from_the_smallest_steps_up():
    for capability in (AVX512_BF16, AVX2):
        rows = [tier.max_rows for tier in plan_cpu(capability).layers]
        assert rows == sorted(rows) and len(set(rows)) == len(rows)


def test_the_host_capability_comes_from_torch():
    detected = CpuCapability.detect()
    assert detected.isa == torch.backends.cpu.get_cpu_capability()
    assert plan_cpu(detected).path in ("avx512_bf16", "avx2", "portable")
