"""The machine a result was made on: CPU model, the fields that can change a run's numbers, one line."""

from __future__ import annotations

import torch

from swarm_node.util.machine import FINGERPRINT_KEYS, cpu_model, describe, fingerprint, machine_info


def test_cpu_model_reads_the_model_name(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu avx2\n\n"
                    "processor\t: 1\nmodel name\t: AMD EPYC 7B13\n")
    assert cpu_model(str(info)) == "AMD EPYC 7B13"
    assert cpu_model(str(tmp_path / "missing"))  # another platform: platform.processor() or machine()


def test_fingerprint_keeps_only_the_fields_that_change_numbers():
    info = machine_info()
    assert info["torch"] == torch.__version__
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    fp = fingerprint(info)
    assert set(fp) <= set(FINGERPRINT_KEYS) and {"cpu", "cpu_capability", "torch"} <= set(fp)
    assert "torch_threads" not in fp and "mem_gib" not in fp  # speed, not arithmetic
    assert fingerprint() == fp  # this machine's by default


def test_describe_is_one_line_per_fingerprint():
    fp = {"cpu": "AMD EPYC", "cpu_capability": "AVX2", "cuda": None, "torch": "2.13.0+cpu", "transformers": "5.19.0"}
    assert describe(fp) == "AMD EPYC (AVX2), torch 2.13.0+cpu, transformers 5.19.0"
    assert describe({"cpu": "Xeon", "cuda": "NVIDIA H200", "torch": "2.13.0"}) == "Xeon, GPU NVIDIA H200, torch 2.13.0"
    assert describe({}) == "not recorded"
