"""The check after every test file (llamaplug_testing.isolation): what one file leaves changed is named and put back."""

from __future__ import annotations

import logging
import os

from llamaplug_testing import isolation

from llamaplug import plugins


def test_what_a_file_leaves_changed_is_named_and_put_back(tmp_path):
    plugins.load_plugins()
    before = isolation.snapshot()
    hidden = next(iter(before.plugins))
    root = logging.getLogger()
    try:
        plugins.pm.register(type("Fake", (), {}), name="isolation-fake")
        plugins.pm.unregister(name=hidden)
        os.environ["LLAMAPLUG_ISOLATION_CHECK"] = "1"
        root.addHandler(logging.NullHandler())
        root.setLevel(logging.CRITICAL)
        os.chdir(tmp_path)
        found = isolation.changes(before, isolation.snapshot())
    finally:
        isolation.restore(before)
    assert found[0] == "$LLAMAPLUG_ISOLATION_CHECK: None -> '1'"
    assert found[1:3] == ["plugin 'isolation-fake' registered", f"plugin {hidden!r} unregistered"]
    assert found[3] == f"root logger level {logging.getLevelName(before.root_level)} -> CRITICAL"
    assert found[4].startswith("root logger handlers") and found[4].endswith("'NullHandler']")
    assert found[5] == f"working folder {before.cwd} -> {tmp_path}" and len(found) == 6
    assert isolation.changes(before, isolation.snapshot()) == []
    assert plugins.pm.get_plugin(hidden) is before.plugins[hidden]


def test_the_plugins_first_load_and_their_order_are_no_change():
    before = isolation.snapshot()
    plugins.load_plugins()
    assert isolation.changes(before, isolation.snapshot()) == []
    name, plugin = next(iter(plugins.pm.list_name_plugin()))
    reloaded = isolation.snapshot()
    plugins.pm.unregister(name=name)
    plugins.pm.register(plugin, name=name)  # now last, as a test that hides a plugin puts it back
    assert isolation.changes(reloaded, isolation.snapshot()) == []
