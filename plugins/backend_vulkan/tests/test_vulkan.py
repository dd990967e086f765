"""The Vulkan backend on this machine: Mesa's lavapipe (a CPU-type Vulkan device) stands in for a GPU.

Every run is a fresh interpreter: the backend set is fixed per process, and a
driver crash must fail the test, not kill pytest. Without a Vulkan driver the
tests fail (with the reason) instead of skipping: install the system packages
with `scripts/sysdeps.sh glslc libvulkan-dev spirv-headers mesa-vulkan-drivers`
and the plugin with `pip install --no-build-isolation ./plugins/backend_vulkan`.
"""

from __future__ import annotations

import json

import pytest
from llamaplug_testing import run_isolated
from llamaplug_testing.gpu import PROMPTS, TEXT, assert_agrees_with_cpu, child_env, offloaded_layers, run_child, status

pytestmark = pytest.mark.vulkan

NO_DRIVER = "/nonexistent/vulkan_icd.json"


@pytest.fixture(scope="module")
def vulkan_plugin():
    """The installed plugin and its module; a missing one is a failure with the fix, not a skip."""
    try:
        import llamaplug_backend_vulkan
    except ImportError as exc:
        pytest.fail(f"llamaplug-backend-vulkan is not installed ({exc}): "
                    "pip install --no-build-isolation ./plugins/backend_vulkan")
    from llamaplug.probes import module_files

    if not module_files(llamaplug_backend_vulkan.LIB, "vulkan"):
        pytest.fail(f"no ggml-vulkan module in {llamaplug_backend_vulkan.LIB}: reinstall llamaplug-backend-vulkan")
    return llamaplug_backend_vulkan


@pytest.fixture(scope="module")
def lavapipe(vulkan_plugin) -> str:
    """The index (for GGML_VK_VISIBLE_DEVICES) of Mesa's lavapipe among the Vulkan devices."""
    code = ("import ctypes, json; from llamaplug_backend_vulkan import probe as v; "
            "print(json.dumps(v.vulkan_devices(ctypes.CDLL(v._LOADER))))")
    done = run_isolated(code, timeout=60, env=child_env())
    assert done.returncode == 0, f"could not list the Vulkan devices:\n{done.stderr[-3000:]}"
    devices, why = json.loads(done.stdout.strip().splitlines()[-1])
    assert devices is not None, f"Vulkan does not run here: {why}"
    index = next((i for i, (name, kind) in enumerate(devices) if kind == "CPU" and "llvmpipe" in name), None)
    assert index is not None, (
        f"no lavapipe (llvmpipe) Vulkan device among {devices}: install mesa-vulkan-drivers "
        "(scripts/sysdeps.sh glslc libvulkan-dev spirv-headers mesa-vulkan-drivers)")
    return str(index)


def test_probe_without_a_driver_says_why_and_cpu_runs(vulkan_plugin, smollm2_path):
    env = child_env(VK_ICD_FILENAMES=NO_DRIVER, VK_DRIVER_FILES=NO_DRIVER)
    result = run_child(smollm2_path, env, prompts=PROMPTS[:1], max_tokens=4)
    vulkan = status(result, "vulkan")
    assert not vulkan["ok"] and not vulkan["loaded"]
    assert "vkCreateInstance failed" in vulkan["reason"] and NO_DRIVER in vulkan["reason"], vulkan["reason"]
    assert "missing" in vulkan["reason"]
    assert status(result, "cpu")["loaded"]
    assert [d["type"] for d in result["devices"]] == ["cpu"], result["devices"]
    assert len(result["completions"][0]) == 4
    assert not any("Vulkan" in line for line in result["log"])


def test_probe_names_cpu_type_devices_and_the_variable(vulkan_plugin, lavapipe):
    code = "import json; from llamaplug_backend_vulkan import probe as v; print(json.dumps(v.probe()))"
    done = run_isolated(code, env=child_env())
    assert done.returncode == 0, done.stderr[-3000:]
    verdict = json.loads(done.stdout.strip().splitlines()[-1])
    if verdict["ok"]:  # a real GPU is there too: lavapipe is simply not needed
        assert verdict["devices"], verdict
        return
    assert "llvmpipe" in verdict["reason"] and "(CPU)" in verdict["reason"], verdict
    assert f"GGML_VK_VISIBLE_DEVICES={lavapipe} makes ggml-vulkan use them" in verdict["reason"], verdict


def test_lavapipe_layers_agree_with_cpu(vulkan_plugin, lavapipe, smollm2_path, tmp_path):
    vk_logits, cpu_logits = tmp_path / "vulkan.npy", tmp_path / "cpu.npy"
    # No LLAMAPLUG_BACKENDS: the probe passes and auto-selection picks Vulkan.
    vk = run_child(smollm2_path, child_env(GGML_VK_VISIBLE_DEVICES=lavapipe), text=TEXT, logits=str(vk_logits))
    cpu = run_child(smollm2_path, child_env(LLAMAPLUG_BACKENDS="cpu"), text=TEXT, logits=str(cpu_logits))

    vulkan = status(vk, "vulkan")
    assert vulkan["ok"] and vulkan["loaded"], vulkan
    assert any("llvmpipe" in d for d in vulkan["devices"]), vulkan
    assert any(d["name"].startswith("Vulkan") for d in vk["devices"]), vk["devices"]
    done, total = offloaded_layers(vk)
    assert done == total > 0, (done, total)
    assert any("Vulkan0 model buffer size" in line for line in vk["log"]), [ln for ln in vk["log"] if "buffer" in ln]
    assert not status(cpu, "vulkan")["loaded"]
    assert not any("Vulkan0" in line for line in cpu["log"])

    assert_agrees_with_cpu(vk, cpu, vk_logits, cpu_logits, "vulkan")
