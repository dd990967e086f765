"""The Vulkan plugin's registration (no Vulkan device needed): its module is shipped, its priority set."""

import llamaplug_backend_vulkan
from llamaplug_backend_vulkan import probe

from llamaplug.plugins import collect
from llamaplug.probes import module_files


def test_registers_vulkan_backend_with_its_module():
    specs = [s for s in collect("llamaplug_register_backends") if s.name == "vulkan"]
    assert len(specs) == 1
    assert specs[0].distribution == "llamaplug-backend-vulkan"
    assert specs[0].priority == 50  # above CPU (0) and RPC (10), below CUDA/ROCm/Metal (100)
    found = module_files(llamaplug_backend_vulkan.LIB, "vulkan")
    assert len(found) == 1 and "ggml-vulkan" in found[0].name


def test_driver_environment_is_named_with_missing_files(monkeypatch):
    monkeypatch.setenv("VK_ICD_FILENAMES", "/nonexistent/icd.json")
    monkeypatch.delenv("VK_DRIVER_FILES", raising=False)
    monkeypatch.delenv("VK_ADD_DRIVER_FILES", raising=False)
    assert probe._driver_env() == (
        "; VK_ICD_FILENAMES=/nonexistent/icd.json (missing: /nonexistent/icd.json)")
