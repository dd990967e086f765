"""Can Vulkan run here? Runs in the probe's child interpreter (a broken driver may crash or hang).

The child runs this file alone (probes.isolated): the standard library only, the core's ggml through ctypes.

It needs the Vulkan loader (libvulkan.so.1), a driver (ICD) that creates an
instance, and a device that ggml-vulkan itself accepts. ggml skips CPU-type
devices (Mesa's lavapipe/llvmpipe) unless GGML_VK_VISIBLE_DEVICES names them.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

LIB = Path(__file__).resolve().parent / "lib"

_LOADER = {"win32": "vulkan-1.dll", "darwin": "libvulkan.1.dylib"}.get(sys.platform, "libvulkan.so.1")
_DEVICE_TYPES = {0: "other", 1: "integrated GPU", 2: "discrete GPU", 3: "virtual GPU", 4: "CPU"}
_VK_ERRORS = {-1: "VK_ERROR_OUT_OF_HOST_MEMORY", -2: "VK_ERROR_OUT_OF_DEVICE_MEMORY",
              -3: "VK_ERROR_INITIALIZATION_FAILED", -7: "VK_ERROR_EXTENSION_NOT_PRESENT",
              -9: "VK_ERROR_INCOMPATIBLE_DRIVER"}
_DRIVER_ENV = ("VK_DRIVER_FILES", "VK_ICD_FILENAMES", "VK_ADD_DRIVER_FILES")


class _InstanceCreateInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                ("pApplicationInfo", ctypes.c_void_p), ("enabledLayerCount", ctypes.c_uint32),
                ("ppEnabledLayerNames", ctypes.c_void_p), ("enabledExtensionCount", ctypes.c_uint32),
                ("ppEnabledExtensionNames", ctypes.c_void_p)]


def vulkan_devices(loader: ctypes.CDLL) -> tuple[list[tuple[str, str]] | None, str]:
    """Every physical device the Vulkan loader sees, as (name, type), or None and why not."""
    create = loader.vkCreateInstance
    create.argtypes = [ctypes.POINTER(_InstanceCreateInfo), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    create.restype = ctypes.c_int
    enumerate_devices = loader.vkEnumeratePhysicalDevices
    enumerate_devices.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32), ctypes.c_void_p]
    enumerate_devices.restype = ctypes.c_int
    properties = loader.vkGetPhysicalDeviceProperties
    properties.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    destroy = loader.vkDestroyInstance
    destroy.argtypes = [ctypes.c_void_p, ctypes.c_void_p]

    info = _InstanceCreateInfo(sType=1)  # VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO
    instance = ctypes.c_void_p()
    rc = create(ctypes.byref(info), None, ctypes.byref(instance))
    if rc != 0:
        return None, f"vkCreateInstance failed ({_VK_ERRORS.get(rc, rc)}): no usable Vulkan driver (ICD){_driver_env()}"
    try:
        count = ctypes.c_uint32(0)
        rc = enumerate_devices(instance, ctypes.byref(count), None)
        if rc != 0:
            return None, f"vkEnumeratePhysicalDevices failed ({_VK_ERRORS.get(rc, rc)}){_driver_env()}"
        handles = (ctypes.c_void_p * count.value)()
        enumerate_devices(instance, ctypes.byref(count), handles)
        found = []
        for handle in handles[:count.value]:
            # VkPhysicalDeviceProperties: 4 uint32 (versions, ids), VkPhysicalDeviceType, char deviceName[256], ...
            buf = ctypes.create_string_buffer(4096)
            properties(handle, buf)
            kind = int.from_bytes(buf.raw[16:20], sys.byteorder)
            name = buf.raw[20:276].split(b"\0", 1)[0].decode(errors="replace")
            found.append((name, _DEVICE_TYPES.get(kind, "other")))
        return found, ""
    finally:
        destroy(instance, None)


def _driver_env() -> str:
    """The environment that redirects the loader's driver search, and whether its files exist."""
    parts = []
    for var in _DRIVER_ENV:
        if os.environ.get(var):
            files = [f for f in os.environ[var].split(os.pathsep) if f]
            missing = [f for f in files if not os.path.exists(f)]
            parts.append(f"{var}={os.environ[var]}" + (f" (missing: {', '.join(missing)})" if missing else ""))
    return f"; {'; '.join(parts)}" if parts else ""


def _core_ggml() -> ctypes.CDLL | None:
    """The core's libggml (found without importing llamaplug), with the five calls the probe makes."""
    spec = importlib.util.find_spec("llamaplug")  # a top-level package: found, not run
    if spec is None or not spec.submodule_search_locations:
        return None
    name = "ggml.dll" if sys.platform == "win32" else "libggml.so"
    path = Path(next(iter(spec.submodule_search_locations))) / "lib" / name
    if not path.is_file():
        return None
    ggml = ctypes.CDLL(str(path))
    for fn, args, res in (("ggml_backend_load", [ctypes.c_char_p], ctypes.c_void_p),
                          ("ggml_backend_reg_dev_count", [ctypes.c_void_p], ctypes.c_size_t),
                          ("ggml_backend_reg_dev_get", [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_void_p),
                          ("ggml_backend_dev_name", [ctypes.c_void_p], ctypes.c_char_p),
                          ("ggml_backend_dev_description", [ctypes.c_void_p], ctypes.c_char_p)):
        getattr(ggml, fn).argtypes, getattr(ggml, fn).restype = args, res
    return ggml


def probe() -> dict[str, Any]:
    """Loader, driver, devices, then the devices ggml-vulkan accepts."""
    try:
        loader = ctypes.CDLL(_LOADER)
    except OSError as exc:
        return {"ok": False, "reason": f"no Vulkan loader ({_LOADER}: {exc}); install libvulkan1 and a driver"}
    devices, why = vulkan_devices(loader)
    if devices is None:
        return {"ok": False, "reason": why}
    if not devices:
        return {"ok": False, "reason": f"the Vulkan loader found no physical device{_driver_env()}"}
    seen = ", ".join(f"{i}: {name} ({kind})" for i, (name, kind) in enumerate(devices))

    modules = sorted(LIB.glob("*ggml-vulkan*.so")) + sorted(LIB.glob("*ggml-vulkan*.dll"))
    if not modules:
        return {"ok": False, "reason": f"no ggml-vulkan module in {LIB}: reinstall llamaplug-backend-vulkan"}
    visible = os.environ.get("GGML_VK_VISIBLE_DEVICES")
    ggml = _core_ggml()
    if ggml is None:
        return {"ok": False, "reason": "llamaplug's own ggml library was not found: reinstall llamaplug"}
    reg = ggml.ggml_backend_load(str(modules[0]).encode())
    if not reg:
        hint = f"; GGML_VK_VISIBLE_DEVICES={visible} must name indices among them" if visible is not None else ""
        return {"ok": False, "reason": f"ggml-vulkan could not initialise Vulkan (devices: {seen}){hint}"}
    usable = []
    for i in range(ggml.ggml_backend_reg_dev_count(reg)):
        dev = ggml.ggml_backend_reg_dev_get(reg, i)
        usable.append(f"{ggml.ggml_backend_dev_name(dev).decode()}: {ggml.ggml_backend_dev_description(dev).decode()}")
    cpu_only = all(kind == "CPU" for _, kind in devices)
    if not usable:
        if cpu_only:
            # Not tried here (a second child would double the probe's cost in every process); the
            # lavapipe test shows the variable works.
            hint = ("GGML_VK_VISIBLE_DEVICES=0 makes ggml-vulkan use them (slow; for testing)" if visible is None
                    else f"GGML_VK_VISIBLE_DEVICES={visible} names none of them")
            return {"ok": False, "reason": f"only CPU-type Vulkan devices ({seen}), which ggml-vulkan skips; {hint}"}
        return {"ok": False, "reason": f"ggml-vulkan accepts none of the Vulkan devices ({seen})"}
    reason = f"{len(usable)} Vulkan device(s) in use"
    if cpu_only:
        reason += f"; CPU-type only ({seen}), made visible by GGML_VK_VISIBLE_DEVICES={visible}"
    elif visible is not None:
        reason += f" (GGML_VK_VISIBLE_DEVICES={visible}; all: {seen})"
    return {"ok": True, "reason": reason, "devices": usable}
