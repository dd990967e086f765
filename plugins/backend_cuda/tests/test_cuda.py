"""The CUDA backend on an NVIDIA GPU (H100/H200 class): runs only where a GPU and its driver are present.

Where the driver is present but the plugin is not installed, the tests fail with the
fix instead of skipping: build it with `make cuda` (see plugins/backend_cuda/README.md).
The comparison with the CPU backend is the one the Vulkan tests make on lavapipe.
"""

from __future__ import annotations

import ctypes

import pytest
from llamaplug_testing import run_isolated
from llamaplug_testing.gpu import PROMPTS, TEXT, assert_agrees_with_cpu, child_env, offloaded_layers, run_child, status


def _driver() -> str | None:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return str(exc)
    return None


pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(_driver() is not None, reason=f"no NVIDIA driver here ({_driver()})")]


@pytest.fixture(scope="module")
def cuda_plugin():
    try:
        import llamaplug_backend_cuda
    except ImportError as exc:
        pytest.fail(f"an NVIDIA driver is here but llamaplug-backend-cuda is not installed ({exc}): make cuda")
    return llamaplug_backend_cuda


@pytest.fixture(scope="module")
def on_cuda(cuda_plugin, smollm2_path, tmp_path_factory):
    logits = tmp_path_factory.mktemp("cuda") / "cuda.npy"
    # No LLAMAPLUG_BACKENDS: the probe passes and priority picks CUDA over everything else.
    result = run_child(smollm2_path, child_env(), text=TEXT, logits=str(logits), max_tokens=8)
    return result, logits


def test_probe_passes_and_cuda_is_chosen(on_cuda):
    result, _ = on_cuda
    cuda = status(result, "cuda")
    assert cuda["ok"] and cuda["loaded"], cuda
    assert any(d["name"] == "CUDA0" and d["type"] == "gpu" for d in result["devices"]), result["devices"]
    others = [s for s in result["backends"] if s["name"] in ("vulkan", "rpc") and s["loaded"]]
    assert all(s["name"] != "vulkan" for s in others), others  # one GPU through one API only


def test_auto_puts_every_layer_on_the_gpu(on_cuda):
    result, _ = on_cuda
    assert result["fit"] and result["fit"]["status"] == "fitted", result["fit"]
    done, total = offloaded_layers(result)
    assert done == total == 31
    assert any("CUDA0 model buffer size" in line for line in result["log"]), result["log"][-30:]


def test_cuda_agrees_with_cpu(on_cuda, smollm2_path, tmp_path):
    gpu, gpu_logits = on_cuda
    cpu_logits = tmp_path / "cpu.npy"
    cpu = run_child(smollm2_path, child_env(LLAMAPLUG_BACKENDS="cpu"), text=TEXT, logits=str(cpu_logits),
                    max_tokens=8)
    assert not any("CUDA0" in line for line in cpu["log"])
    assert_agrees_with_cpu(gpu, cpu, gpu_logits, cpu_logits, "cuda")


def test_fit_leaves_the_asked_memory_free(on_cuda, smollm2_path):
    result, _ = on_cuda
    free_mib = next(d for d in result["devices"] if d["name"] == "CUDA0")["memory_free"] // 2**20
    tight = run_child(smollm2_path, child_env(), prompts=PROMPTS[:1], max_tokens=4,
                      params={"fit_target_mib": [free_mib - 180]})
    assert tight["fit"]["status"] == "fitted"
    assert 0 < tight["fit"]["n_gpu_layers"] < 31, tight["fit"]
    assert offloaded_layers(tight)[0] == tight["fit"]["n_gpu_layers"]
    assert tight["completions"][0][0] == result["completions"][0][0]


def test_cpu_only_devices_list_keeps_cuda_idle(cuda_plugin, smollm2_path):
    result = run_child(smollm2_path, child_env(), prompts=PROMPTS[:1], max_tokens=4, params={"devices": []})
    assert status(result, "cuda")["loaded"]
    assert not any("CUDA0 model buffer size" in line for line in result["log"])


def test_module_is_built_with_cuda_graphs(cuda_plugin):
    # A plugin adds ggml/ directly, where GGML_CUDA_GRAPHS defaults off; without graphs a small model's
    # generation ran at 0.45x native llama-bench on an H100 (docs/benchmarks.md).
    info = run_isolated("""
        import json, llamaplug as lp
        print("RESULT " + json.dumps(lp.LlamaBackend.init().system_info()))
    """, env={"LLAMAPLUG_BACKENDS": "cuda"}, result=True)
    assert "USE_GRAPHS = 1" in info, info
