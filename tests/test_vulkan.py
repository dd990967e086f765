"""The Vulkan backend on this machine: Mesa's lavapipe (a CPU-type Vulkan device) stands in for a GPU.

Every run is a fresh interpreter: the backend set is fixed per process, and a
driver crash must fail the test, not kill pytest. Without a Vulkan driver the
tests fail (with the reason) instead of skipping: install the system packages
with `scripts/sysdeps.sh glslc libvulkan-dev spirv-headers mesa-vulkan-drivers`
and the plugin with `pip install --no-build-isolation ./plugins/backend_vulkan`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

pytestmark = pytest.mark.vulkan

NO_DRIVER = "/nonexistent/vulkan_icd.json"
# Teacher forcing: one batch decode of this text with logits for every position.
TEXT = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
        "It is named after the engineer Gustave Eiffel, whose company designed and built the tower.")
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of"]
CHILD_TIMEOUT = 900

CHILD = textwrap.dedent("""
    import dataclasses, json, logging, sys, time
    import numpy as np
    import llamaplug as lp

    args = json.loads(sys.argv[1])
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("llamaplug.native").addHandler(handler)
    out = {}
    t0 = time.monotonic()
    params = lp.LlamaParams(model_path=args["model"], n_ctx=256, n_threads=2, log_level="info")
    with lp.Llama.load(params) as llama:
        out["load_s"] = time.monotonic() - t0
        out["backends"] = [dataclasses.asdict(s) for s in llama.backend.backends()]
        out["devices"] = [dataclasses.asdict(d) for d in llama.backend.devices()]
        if args["text"]:
            tokens = llama.tokenize(args["text"])
            batch = lp.LlamaBatch(len(tokens), 1)
            batch.add_sequence(tokens, logits_all=True)
            llama.context.clear_cache()
            t0 = time.monotonic()
            llama.context.decode(batch)
            logits = np.array(llama.context.get_logits())  # waits for the (asynchronous) compute
            out["decode_s"] = time.monotonic() - t0
            np.save(args["logits"], logits)
            out["tokens"] = tokens
        t0 = time.monotonic()
        out["completions"] = [
            llama.create_completion(p, max_tokens=args["max_tokens"], sampler=lp.SamplerChain().greedy()).tokens
            for p in args["prompts"]
        ]
        out["completion_s"] = time.monotonic() - t0
    out["log"] = lines
    print("RESULT " + json.dumps(out))
""")


def child_env(**changes: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LLAMAPLUG_BACKENDS", "GGML_VK_VISIBLE_DEVICES", "VK_ICD_FILENAMES", "VK_DRIVER_FILES")}
    env["PYTHONFAULTHANDLER"] = "1"
    env.update({k: v for k, v in changes.items() if v is not None})
    return env


def run_child(model, env: dict[str, str], *, text: str = "", logits: str = "", prompts=PROMPTS,
              max_tokens: int = 1) -> dict:
    args = {"model": str(model), "text": text, "logits": logits, "prompts": prompts, "max_tokens": max_tokens}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT, env=env)
    assert done.returncode == 0, f"child failed (rc {done.returncode}):\n{done.stderr[-4000:]}"
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    result["wall_s"] = time.monotonic() - t0
    return result


def status(result: dict, name: str) -> dict:
    found = [s for s in result["backends"] if s["name"] == name]
    assert found, f"no {name} backend in {result['backends']}"
    return found[0]


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
    code = ("import ctypes, json, llamaplug_backend_vulkan as v; "
            "print(json.dumps(v.vulkan_devices(ctypes.CDLL(v._LOADER))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=child_env())
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
    code = "import json, llamaplug_backend_vulkan as v; print(json.dumps(v.check()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=child_env())
    assert done.returncode == 0, done.stderr[-3000:]
    verdict = json.loads(done.stdout.strip().splitlines()[-1])
    if verdict["ok"]:  # a real GPU is there too: lavapipe is simply not needed
        assert verdict["devices"], verdict
        return
    assert "llvmpipe" in verdict["reason"] and "(CPU)" in verdict["reason"], verdict
    assert f"GGML_VK_VISIBLE_DEVICES={lavapipe} makes them visible" in verdict["reason"], verdict


def test_lavapipe_layers_agree_with_cpu(vulkan_plugin, lavapipe, smollm2_path, tmp_path):
    vk_logits, cpu_logits = tmp_path / "vulkan.npy", tmp_path / "cpu.npy"
    # No LLAMAPLUG_BACKENDS: the probe passes and auto-selection picks Vulkan.
    vk = run_child(smollm2_path, child_env(GGML_VK_VISIBLE_DEVICES=lavapipe), text=TEXT, logits=str(vk_logits))
    cpu = run_child(smollm2_path, child_env(LLAMAPLUG_BACKENDS="cpu"), text=TEXT, logits=str(cpu_logits))

    vulkan = status(vk, "vulkan")
    assert vulkan["ok"] and vulkan["loaded"], vulkan
    assert any("llvmpipe" in d for d in vulkan["devices"]), vulkan
    assert any(d["name"].startswith("Vulkan") for d in vk["devices"]), vk["devices"]
    n_layer = next(line for line in vk["log"] if "offloaded" in line and "layers to GPU" in line)
    done, total = n_layer.split("offloaded ")[1].split(" layers")[0].split("/")
    assert done == total and int(total) > 0, n_layer
    assert any("Vulkan0 model buffer size" in line for line in vk["log"]), [ln for ln in vk["log"] if "buffer" in ln]
    assert not status(cpu, "vulkan")["loaded"]
    assert not any("Vulkan0" in line for line in cpu["log"])

    assert vk["tokens"] == cpu["tokens"] and 30 <= len(cpu["tokens"]) <= 48, len(cpu["tokens"])
    a, b = np.load(vk_logits), np.load(cpu_logits)
    assert a.shape == b.shape == (len(cpu["tokens"]), a.shape[1])
    vk_top, cpu_top = a.argmax(axis=1), b.argmax(axis=1)
    rows = np.arange(len(b))
    agree = float(np.mean(vk_top == cpu_top))
    # Where they differ, Vulkan's choice must be a near-tie on the CPU too (fp16 shaders vs q8 activations).
    cpu_gap = b[rows, cpu_top] - b[rows, vk_top]
    diff = np.abs(a - b)
    max_diff, mean_diff, spread = float(diff.max()), float(diff.mean()), float(np.abs(b).max())
    corr = min(float(np.corrcoef(x, y)[0, 1]) for x, y in zip(a, b))
    print(f"\nvulkan vs cpu: {len(b)} positions, argmax agreement {agree:.3f} (largest CPU gap where they differ "
          f"{cpu_gap.max():.3f}), |logit diff| max {max_diff:.3f} mean {mean_diff:.3f} (logits up to {spread:.1f}), "
          f"min correlation {corr:.5f}; batch decode {vk['decode_s']:.1f} s vs {cpu['decode_s']:.1f} s; "
          f"child wall {vk['wall_s']:.1f} s vs {cpu['wall_s']:.1f} s")
    assert agree >= 0.95, (agree, max_diff)
    assert cpu_gap.max() < 0.5, cpu_gap
    assert corr > 0.995 and mean_diff < 0.02 * spread and max_diff < 0.1 * spread, (corr, mean_diff, max_diff, spread)
    assert [c[0] for c in vk["completions"]] == [c[0] for c in cpu["completions"]], (vk["completions"],
                                                                                     cpu["completions"])
