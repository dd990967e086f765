"""Plugin machinery: entry points, LLAMAPLUG_PLUGINS, probe verdicts, refusing another pin, `llamaplug info`."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import threading

import pytest
from llamaplug_testing import run_isolated as child

import llamaplug as lp
from llamaplug import plugins


def test_no_backend_plugin_names_the_package():
    r = child("""
        import llamaplug as lp
        try:
            lp.LlamaBackend.init()
        except lp.NoBackendError as e:
            print("OK", e)
    """, env={"LLAMAPLUG_PLUGINS": ""})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("OK") and "pip install llamaplug-backend-cpu" in r.stdout


FAKES = """
    import llamaplug as lp
    from llamaplug import plugins
    from llamaplug.probes import BackendSpec, ProbeResult

    class Fakes:
        @lp.hookimpl
        def llamaplug_register_backends(register):
            register(BackendSpec("oldpin", "llamaplug-backend-oldpin", 50, lambda: ProbeResult(True, "fine"),
                                 "deadbeef", lp.GGML_VERSION))
            def boom():
                raise RuntimeError("driver exploded")
            register(BackendSpec("crashy", "llamaplug-backend-crashy", 60, boom, lp.LLAMA_CPP_COMMIT, lp.GGML_VERSION))

    plugins.load_plugins()
    plugins.pm.register(Fakes, name="fakes")
"""


def test_probe_failure_and_other_pin_are_verdicts_not_crashes():
    r = child(FAKES + """
    status = {s.name: s for s in lp.backends()}
    print(status["crashy"].ok, status["crashy"].reason)
    print(status["oldpin"].ok, status["oldpin"].reason)
    print(status["cpu"].loaded)
    """)
    assert r.returncode == 0, r.stderr
    crashy, oldpin, cpu = r.stdout.splitlines()
    assert crashy.startswith("False") and "driver exploded" in crashy
    assert oldpin.startswith("False") and "deadbeef" in oldpin and "reinstall llamaplug-backend-oldpin" in oldpin
    assert cpu == "True"


@pytest.mark.parametrize("name,error", [("oldpin", "BackendMismatchError"), ("crashy", "BackendError"),
                                        ("nosuch", "NoBackendError")])
def test_requesting_a_backend_that_cannot_run_is_an_error(name, error):
    r = child(FAKES + f"""
    try:
        lp.LlamaBackend.init(backends=["{name}"])
    except lp.LlamaError as e:
        print(type(e).__name__, e)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == error and name in r.stdout


def test_broken_entry_point_is_reported_and_limited_by_env(tmp_path):
    dist = tmp_path / "llamaplug_broken-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: llamaplug-broken\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[llamaplug]\nbroken = llamaplug_broken_plugin\n")
    (tmp_path / "llamaplug_broken_plugin.py").write_text("raise ImportError('missing libfoo.so')\n")
    code = "from llamaplug import plugins; print(plugins.broken_plugins())"
    r = child(code, path=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "broken" in r.stdout and "missing libfoo.so" in r.stdout
    r = child(code, path=str(tmp_path), env={"LLAMAPLUG_PLUGINS": "backend_cpu"})
    assert r.returncode == 0 and r.stdout.strip() == "{}"


def test_raising_register_hook_is_reported_not_raised():
    # A plugin that imports but whose registration fails (an installed plugin whose build
    # is incomplete, say) must not take backend init down, and what it half-registered is dropped.
    r = child("""
        import llamaplug as lp
        from llamaplug import plugins
        from llamaplug.probes import BackendSpec, ProbeResult

        class HalfBuilt:
            @lp.hookimpl
            def llamaplug_register_backends(register):
                register(BackendSpec("half", "llamaplug-backend-half", 90, lambda: ProbeResult(True, "fine"),
                                     lp.LLAMA_CPP_COMMIT, lp.GGML_VERSION))
                raise ImportError("cannot import name '_build_info'")

        plugins.load_plugins()
        plugins.pm.register(HalfBuilt, name="halfbuilt")
        status = {s.name: s for s in lp.LlamaBackend.init().backends()}
        print(sorted(status), status["cpu"].loaded)
        print(plugins.broken_plugins()["halfbuilt"])
    """)
    assert r.returncode == 0, r.stderr
    names, error = r.stdout.splitlines()
    assert "'half'" not in names and "'cpu'" in names and names.endswith("True")
    assert error == "llamaplug_register_backends: ImportError: cannot import name '_build_info'"


def test_info_names_a_plugin_whose_hook_raises(tmp_path):
    dist = tmp_path / "llamaplug_halfbuilt-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: llamaplug-halfbuilt\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[llamaplug]\nhalfbuilt = llamaplug_halfbuilt\n")
    (tmp_path / "llamaplug_halfbuilt.py").write_text(textwrap.dedent("""
        import llamaplug as lp

        @lp.hookimpl
        def llamaplug_register_backends(register):
            raise FileNotFoundError("libggml-half.so is missing")
    """))
    r = child("from llamaplug.cli import main; main(['info'])", path=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "halfbuilt: broken: llamaplug_register_backends: FileNotFoundError: libggml-half.so is missing" in r.stdout
    assert next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("cpu ")).split()[1] == "loaded"


def test_info_lists_cpu_backend_with_variant():
    from llamaplug_backend_cpu import variants

    expected = variants.best_variant(variants.cpu_flags())
    r = subprocess.run([sys.executable, "-m", "llamaplug.cli", "info"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("cpu "))
    assert "loaded" in line and f"variant {expected}" in line
    assert "0c1e57098" in r.stdout and "ggml 0.25.3" in r.stdout
    assert "smollm2-135m-instruct" in r.stdout


def test_cli_run_streams_default_model(llama):
    prompt = "The capital of France is"
    r = subprocess.run([sys.executable, "-m", "llamaplug.cli", "run", "--raw", "--temp", "0", "-n", "16", "-t", "2",
                        "-c", "2048", prompt], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    expected = llama.create_completion(prompt, max_tokens=16).text
    assert r.stdout == prompt + expected + "\n"
    assert "[max_tokens]" in r.stderr


def test_cli_bench_measures_what_it_says(llama, smollm2_path):
    r = subprocess.run([sys.executable, "-m", "llamaplug.cli", "bench", "-m", str(smollm2_path), "-t", "2",
                        "--pp", "64", "--tg", "8", "--batched", "1,2", "--inner", "1", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["threads"] == 2 and "cpu" in result["backends"]
    assert result["pp"]["tokens"] == 64 and result["pp"]["tps"] > 0
    assert result["tg"]["tokens"] == 8 and result["tg"]["tps"] > 0
    # the generation it timed is the real greedy continuation of its prompt
    expected = llama.create_completion("1, 2, 3, 4, 5, 6, 7, 8,", max_tokens=8, sampler=lp.SamplerChain().greedy())
    assert result["tg"]["text_head"] == expected.text[:40]
    assert [row["npl"] for row in result["batched"]] == [1, 2]
    assert all(row["tg_tps"] > 0 for row in result["batched"])


def test_cli_reports_errors_without_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "llamaplug.cli", "run", "-m", str(tmp_path / "nope.gguf"), "hi"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "ModelNotFoundError" in r.stderr and "nope.gguf" in r.stderr and "Traceback" not in r.stderr


def test_crashing_and_hanging_probes_are_verdicts(tmp_path):
    (tmp_path / "fakegpu_probe.py").write_text(
        "import ctypes, time\n"
        "def crash():\n    return ctypes.string_at(0)\n"
        "def hang():\n    time.sleep(600)\n"
        "def fine():\n    return {'ok': True, 'reason': 'fake device', 'devices': ['Fake GPU 0']}\n"
    )
    r = child("""
        from llamaplug.probes import isolated
        print(isolated("fakegpu_probe", "crash")["reason"])
        print(isolated("fakegpu_probe", "hang", timeout=3)["reason"])
        print(isolated("fakegpu_probe", "fine"))
        print("ALIVE")
    """, path=str(tmp_path))
    assert r.returncode == 0, r.stderr
    crash, hang, fine, alive = r.stdout.splitlines()
    assert "crashed" in crash and "SIGSEGV" in crash
    assert "timed out after 3 s" in hang
    assert "'ok': True" in fine and alive == "ALIVE"


def test_priority_and_one_gpu_through_two_apis():
    r = child("""
        import llamaplug as lp
        from llamaplug import plugins
        from llamaplug.probes import BackendSpec, ProbeResult

        gpu = ProbeResult(True, "fake", devices=("Fake GPU 0",))
        class Fakes:
            @lp.hookimpl
            def llamaplug_register_backends(register):
                for name, prio in (("fakevk", 50), ("fakecuda", 100)):
                    register(BackendSpec(name, "x", prio, lambda: gpu, lp.LLAMA_CPP_COMMIT, lp.GGML_VERSION))
        plugins.load_plugins()
        plugins.pm.register(Fakes, name="fakes")
        for s in lp.backends():
            print(s.name, s.loaded, s.reason)
    """)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    fakes = [ln for ln in lines if ln.startswith("fake")]  # real GPU plugins may be installed too
    assert [ln.split()[0] for ln in fakes] == ["fakecuda", "fakevk"]  # by priority
    assert fakes[0].split()[1] == "True"
    assert fakes[1].split()[1] == "False" and "already used through fakecuda" in fakes[1]
    assert any(ln.startswith("cpu True") for ln in lines)


def test_a_sampler_plugin_is_called_by_name(llama):
    """llamaplug_register_samplers: SamplerChain.add(name, ...) makes the plugin's sampler and owns it."""
    from llamaplug import plugins

    made = []

    class SamplerPlugin:
        @lp.hookimpl
        def llamaplug_register_samplers(register):
            def top_few(k):
                made.append(k)
                return lp.LlamaSampler.top_k(k)

            register("top_few", top_few)
            register("not_a_sampler", lambda: object())

    plugins.load_plugins()
    plugins.pm.register(SamplerPlugin, name="fake-samplers")
    try:
        chain = lp.SamplerChain(seed=3).add("top_few", k=1).dist(3)
        assert made == [1] and chain.names == ["top_k", "dist"]
        greedy = llama.create_completion("The capital of France is", 6).tokens
        # top-1 then dist is greedy whatever the seed.
        assert llama.create_completion("The capital of France is", 6, sampler=chain).tokens == greedy
        with pytest.raises(lp.InvalidParameterError, match="neither a LlamaSampler"):
            lp.SamplerChain().add("not_a_sampler")
        with pytest.raises(lp.InvalidParameterError, match="no sampler plugin registered 'missing'"):
            lp.SamplerChain().add("missing")
    finally:
        plugins.pm.unregister(name="fake-samplers")


# -- the media and CLI hooks, with fake plugins ---------------------------------------------------------------------


class FakePlugins:
    """Fake plugins for one test: `add(obj, name)` registers one, `hide(hook)` takes out the installed ones that
    implement `hook` (so that the core is seen without them); the fixture puts everything back."""

    def __init__(self):
        self.added: list[str] = []
        self.hidden: list[tuple[str, object]] = []

    def add(self, plugin: object, name: str) -> None:
        plugins.pm.register(plugin, name=name)
        self.added.append(name)

    def hide(self, hook_name: str) -> None:
        for impl in getattr(plugins.pm.hook, hook_name).get_hookimpls():
            plugin = plugins.pm.unregister(name=impl.plugin_name)
            if impl.plugin_name in self.added:  # one of this test's fakes: gone, not to be put back at the end
                self.added.remove(impl.plugin_name)
            else:
                self.hidden.append((impl.plugin_name, plugin))


@pytest.fixture
def fake_plugins():
    plugins.load_plugins()
    fakes = FakePlugins()
    yield fakes
    for name in reversed(fakes.added):
        plugins.pm.unregister(name=name)
    for name, plugin in fakes.hidden:
        plugins.pm.register(plugin, name=name)


class FakePrompt:
    """A MediaPrompt that is only the text's tokens (the fake projector drops its images)."""

    def __init__(self, tokens: list[int]):
        self.tokens = tokens
        self.evaluated: list[tuple[int, int]] = []

    @property
    def n_pos(self) -> int:
        return len(self.tokens)

    def eval(self, llama_context, n_past, seq_id, n_batch, logits_last):
        batch = lp.LlamaBatch(len(self.tokens))
        batch.add_sequence(self.tokens, seq_id, False, n_past)
        llama_context.decode(batch)
        self.evaluated.append((n_past, seq_id))
        return n_past + len(self.tokens)


class FakeProjector:
    def __init__(self, model):
        self.model = model
        self.prompts: list[FakePrompt] = []

    def has_media(self, messages):
        return any(isinstance(m.get("content"), list) for m in messages)

    def chat_prompt(self, messages, render):
        flat = [{**m, "content": "\n".join(p["text"] for p in m["content"] if p["type"] == "text")}
                if isinstance(m["content"], list) else m for m in messages]
        prompt, extra = render(flat)
        self.prompts.append(FakePrompt(self.model.tokenize(prompt, self.model.add_bos, special=True)))
        return self.prompts[-1], extra


class FakeMedia:
    """Takes *.fake projector files; *.bad ones it cannot read."""

    opened: list[FakeProjector] = []
    threads: list[str] = []  # where each was opened (a real projector's opening encodes: its warm-up)

    @lp.hookimpl
    def llamaplug_open_projector(path, model, params):
        if path.suffix != ".fake":
            return None
        FakeMedia.opened.append(FakeProjector(model))
        FakeMedia.threads.append(threading.current_thread().name)
        return FakeMedia.opened[-1]

    @lp.hookimpl
    def llamaplug_describe_projector(path):
        if path.suffix == ".bad":
            raise lp.InvalidModelError(f"{path} is not a fake projector")
        return "fake: yes" if path.suffix == ".fake" else None


IMAGE_TURN = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///a.png"}},
                                           {"type": "text", "text": "The capital of France is"}]}]
TEXT_TURN = [{"role": "user", "content": "The capital of France is"}]


def test_a_projector_plugin_makes_the_chat_prompt_of_media_messages(fake_plugins, smollm2_path, tmp_path):
    from llamaplug_testing import THREADS

    from llamaplug.plugin_api import MediaPrompt, Projector

    fake_plugins.add(FakeMedia, "fake-media")
    FakeMedia.opened.clear()
    FakeMedia.threads.clear()
    params = lp.LlamaParams(model_path=smollm2_path, mmproj_path=tmp_path / "p.fake", n_ctx=512, n_threads=THREADS)
    with lp.Llama.load(params) as llama:
        [projector] = FakeMedia.opened
        assert isinstance(projector, Projector) and projector.model is llama.model
        assert FakeMedia.threads == ["llamaplug-engine"]  # opened where every compute runs (high/engine.py)
        media = llama.create_chat_completion(IMAGE_TURN, max_tokens=6)
        [prompt] = projector.prompts
        assert isinstance(prompt, MediaPrompt) and prompt.evaluated == [(0, 0)]  # the engine evaluated it
        text = llama.create_chat_completion(TEXT_TURN, max_tokens=6)
        assert len(projector.prompts) == 1  # text-only messages take the template path
    # The fake's prompt is the text's: the same reply as the text alone.
    assert media.choices[0].message.content == text.choices[0].message.content
    assert media.usage.prompt_tokens == text.usage.prompt_tokens == prompt.n_pos


def test_without_a_projector_plugin_the_errors_name_the_package(fake_plugins, llama, smollm2_path, tmp_path):
    fake_plugins.hide("llamaplug_open_projector")
    with pytest.raises(lp.InvalidParameterError, match="pip install llamaplug-mtmd") as err:
        lp.Llama.load(lp.LlamaParams(model_path=smollm2_path, mmproj_path=tmp_path / "p.gguf", n_ctx=256))
    assert err.value.field == "mmproj_path"
    with pytest.raises(lp.InvalidParameterError, match=r"pip install llamaplug-mtmd\) and LlamaParams\(mmproj_path"):
        llama.create_chat_completion(IMAGE_TURN, max_tokens=2)
    fake_plugins.add(FakeMedia, "fake-media")  # a projector plugin, but this Llama has no projector
    with pytest.raises(lp.InvalidParameterError, match=r"a projector: LlamaParams\(mmproj_path=...\) "
                                                       r"\(fake-media is installed\)") as err:
        llama.create_chat_completion(IMAGE_TURN, max_tokens=2)
    assert err.value.field == "messages[0].content[0]"


def test_info_mmproj_asks_the_describe_hook(fake_plugins, capsys, tmp_path):
    from llamaplug.cli import main

    fake_plugins.add(FakeMedia, "fake-media")
    good, bad = tmp_path / "p.fake", tmp_path / "p.bad"
    assert main(["info", "--mmproj", str(good)]) == 0
    assert f"  mmproj {good}: fake: yes  [fake-media]" in capsys.readouterr().out.splitlines()
    assert main(["info", "--mmproj", str(bad)]) == 1
    assert f"  mmproj {bad}: {bad} is not a fake projector" in capsys.readouterr().out.splitlines()
    fake_plugins.hide("llamaplug_describe_projector")
    assert main(["info", "--mmproj", str(good)]) == 1
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "multimodal:", f"  mmproj {good}: cannot read it: pip install llamaplug-mtmd"]


def test_a_plugin_adds_cli_commands(fake_plugins, capsys, caplog):
    from llamaplug.cli import cmd_info, main, parser
    from llamaplug.plugin_api import Command

    def hello(args):
        print(f"hello {args.name}")
        return 7

    def fails(args):
        raise lp.InvalidParameterError("no such thing", field="thing")

    class FakeCommands:
        @lp.hookimpl
        def llamaplug_register_commands(register):
            register(Command("hello", hello, lambda p: p.add_argument("--name", default="world"), help="say hello"))
            register(Command("tokenizer hello", hello, lambda p: p.add_argument("name")))
            register(Command("fake fails", fails))  # a new group
            register(Command("info", hello))  # taken by the core: left out
            register(Command("a b c", hello))  # not 'word' or 'group word': left out
            register("not a command")

    fake_plugins.add(FakeCommands, "fake-commands")
    # The warnings are asserted whatever level an earlier test in this process left on the loggers (CI's whole
    # run lost them: caplog.text was empty there, never alone).
    caplog.set_level(logging.WARNING, logger="llamaplug.cli")
    assert main(["hello", "--name", "plugins"]) == 7
    assert main(["tokenizer", "hello", "you"]) == 7
    assert capsys.readouterr().out == "hello plugins\nhello you\n"
    assert main(["fake", "fails"]) == 1
    assert "llamaplug: InvalidParameterError: no such thing\n" in capsys.readouterr().err
    assert parser().parse_args(["info"]).func is cmd_info
    assert "fake-commands" not in plugins.broken_plugins()
    assert "plugin fake-commands: command 'info' is taken: left out" in caplog.text
    assert "plugin fake-commands: 'not a command' is not a Command" in caplog.text


def test_tokenizer_export_without_the_plugin_names_the_package(fake_plugins, capsys, tmp_path):
    from llamaplug.cli import main

    fake_plugins.hide("llamaplug_register_commands")
    assert main(["tokenizer", "export", str(tmp_path / "m.gguf"), "-o", str(tmp_path / "t.json")]) == 1
    assert ("llamaplug: TokenizerError: `llamaplug tokenizer export` needs the tokenizer plugin: "
            "pip install llamaplug-tokenizer-hf\n") in capsys.readouterr().err
