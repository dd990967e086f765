"""The RPC plugin's registration: its module is found and needs no hardware."""

import llamaplug_backend_rpc

from llamaplug.plugins import collect


def test_registers_rpc_backend_with_its_module():
    specs = [s for s in collect("llamaplug_register_backends") if s.name == "rpc"]
    assert len(specs) == 1
    verdict = specs[0].probe()
    assert verdict.ok and verdict.modules
    assert verdict.modules[0].parent == llamaplug_backend_rpc.LIB and "ggml-rpc" in verdict.modules[0].name
