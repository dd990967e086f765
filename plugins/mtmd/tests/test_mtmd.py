"""llamaplug-mtmd against the pinned llama-mtmd-cli (the independent reference), on generated tiny models.

The text model is tests/fixtures/tiny_gguf.py's, the projectors tests/fixtures/tiny_mmproj.py's
(types gemma3 for images and qwen2a for audio of the pinned clip.cpp, random weights). The same
image(s) or audio clip and prompt go through llama-mtmd-cli (chatml template, greedy) and through
llamaplug: the same text comes out.
"""

from __future__ import annotations

import subprocess
import sys

import llamaplug_mtmd._cffi  # noqa: F401 - a plugin that failed to build fails here, never skips
import pytest
from fixtures.tiny_mmproj import bmp_bytes, png_bytes, sample_image, sample_tone, wav_bytes
from llamaplug_mtmd import DEFAULT_MARKER, MtmdBitmap, MtmdContext, MtmdParams  # noqa: E402
from llamaplug_testing import CHATML, REPO, THREADS, greedy

import llamaplug as lp  # noqa: E402

N_CTX = {"image": 256, "audio": 1024}  # an audio window is 750 tokens
N_PREDICT = 16


@pytest.fixture(scope="module")
def files(mtmd_files, tmp_path_factory):
    """The tiny text model and projectors (conftest's mtmd_files) and the media these comparisons use."""
    root = tmp_path_factory.mktemp("mtmd-parity")
    out = {"text": mtmd_files["text"], "image": mtmd_files["mmproj"], "audio": mtmd_files["mmproj_audio"]}
    for name, data in (("a.png", png_bytes(sample_image(seed=1))), ("b.bmp", bmp_bytes(sample_image(60, 20, 2))),
                       ("c.png", png_bytes(sample_image(50, 50, 3))), ("d.wav", wav_bytes(sample_tone(1.5, hz=300)))):
        (root / name).write_bytes(data)
        out[name] = root / name
    return out


def kind_of(name: str) -> str:
    return "audio" if name.endswith(".wav") else "image"


def cli_text(native_tools, files, media: list[str], prompt: str, n_ctx: int | None = None) -> str:
    # One thread: the same numbers as two (each output is one thread's sum), and twice, on this loaded
    # 2-core machine, a 2-thread llama-mtmd-cli stopped after one token where it otherwise goes on.
    kind = kind_of(media[0])
    cmd = [str(native_tools / "llama-mtmd-cli"), "-m", str(files["text"]), "--mmproj", str(files[kind]),
           "-p", prompt, "--chat-template", "chatml", "--temp", "0", "-n", str(4 * N_PREDICT), "-t", "1",
           "-c", str(n_ctx or N_CTX[kind]), "--no-warmup"]
    for name in media:
        cmd += [f"--{kind_of(name)}", str(files[name])]
    # The CLI prints through llama.cpp's asynchronous logger, which can lose the end of what it
    # printed when the process exits. So it generates 4x as many tokens as llamaplug, is run
    # three times, and the longest text is kept: llamaplug's text must be its start (same_text).
    texts = []
    for _ in range(3):
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        texts.append(run.stdout)
    return max(texts, key=len)


def same_text(ours: str, reference: str) -> bool:
    """llamaplug's N_PREDICT-token text is where the CLI's longer greedy text starts."""
    return bool(ours.strip()) and reference.strip().startswith(ours.strip())


def llamaplug_text(files, media: list[str], prompt: str) -> str:
    lp.LlamaBackend.init()
    kind = kind_of(media[0])
    with lp.LlamaModel(files["text"], lp.ModelParams()) as model:
        ctx = lp.LlamaContext(model, lp.ContextParams(n_ctx=N_CTX[kind], n_threads=THREADS))
        mtmd = MtmdContext(files[kind], model, MtmdParams(n_threads=THREADS, warmup=False))
        bitmaps = [MtmdBitmap.from_file(files[name], mtmd) for name in media]
        # llama-mtmd-cli puts one marker per medium before a prompt that has none
        chunks = mtmd.tokenize(CHATML.format(DEFAULT_MARKER * len(media) + prompt), bitmaps)
        n_past = chunks.eval(ctx, 0)
        assert n_past == chunks.n_pos
        return model.detokenize(greedy(model, ctx, N_PREDICT))


@pytest.mark.parametrize("media", [["a.png"], ["b.bmp", "c.png"], ["d.wav"]])
def test_same_greedy_text_as_llama_mtmd_cli(native_tools, files, media):
    ours = llamaplug_text(files, media, "hello world")
    reference = cli_text(native_tools, files, media, "hello world")
    assert ours.strip(), "the tiny model generated nothing to compare"
    assert same_text(ours, reference), (ours, reference)


def test_info_lists_the_plugin_and_the_projectors_capabilities(files):
    for kind, answer in (("image", "vision: yes, audio: no"), ("audio", "vision: no, audio: yes")):
        out = subprocess.run([sys.executable, "-m", "llamaplug.cli", "info", "--mmproj", str(files[kind])],
                             capture_output=True, text=True, timeout=120, cwd=REPO)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert "  mtmd" in lines
        assert f"  mmproj {files[kind]}: {answer}  [llamaplug-mtmd]" in lines
    broken = subprocess.run([sys.executable, "-m", "llamaplug.cli", "info", "--mmproj", str(files["text"])],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert broken.returncode == 1 and "text.gguf" in broken.stdout


def test_chat_messages_with_image_and_audio_parts(native_tools, files):
    """OpenAI-style parts -> prompt with markers + bitmaps (the plugin's prepare_chat) -> the same text as the CLI.

    The Llama-side hook (Llama.load opening the MtmdContext, the engine evaluating chunks) is not
    wired yet; this drives the same steps by hand through the core's chat template."""
    import base64

    from llamaplug_mtmd import prepare_chat

    from llamaplug.high.chat import check_messages, render_prompt

    png = base64.b64encode(files["a.png"].read_bytes()).decode()
    cases = {
        "image": ([{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
                   {"type": "text", "text": "hello world"}], ["a.png"]),
        "audio": ([{"type": "input_audio", "input_audio": {"data": base64.b64encode(files["d.wav"].read_bytes())
                                                           .decode(), "format": "wav"}},
                   {"type": "text", "text": "hello world"}], ["d.wav"]),
        "file url": ([{"type": "image_url", "image_url": {"url": files["a.png"].as_uri()}},
                      {"type": "text", "text": "hello world"}], ["a.png"]),
    }
    with lp.Llama.load(lp.LlamaParams(model_path=files["text"], n_ctx=max(N_CTX.values()), n_threads=THREADS)) as llama:
        projectors = {kind: MtmdContext(files[kind], llama.model, MtmdParams(n_threads=THREADS, warmup=False))
                      for kind in ("image", "audio")}
        for name, (content, media) in cases.items():
            kind = kind_of(media[0])
            mtmd = projectors[kind]
            messages = [{"role": "user", "content": content}]
            chunks, _ = prepare_chat(mtmd, messages,
                                     lambda flat: render_prompt(llama, check_messages(flat), None, None))
            ctx = llama.context
            ctx.clear_cache()
            chunks.eval(ctx, 0)
            chain, tokens = lp.SamplerChain().greedy(), []
            for _ in range(N_PREDICT):
                token = chain.sample(ctx, -1)
                if llama.model.token_is_eog(token):
                    break
                tokens.append(token)
                ctx.decode_single(token)
            ours = llama.model.detokenize(tokens)
            reference = cli_text(native_tools, files, media, "hello world", n_ctx=max(N_CTX.values()))
            assert same_text(ours, reference), (name, ours, reference)


def test_llama_chat_with_an_image_part_equals_the_cli(native_tools, files):
    """LlamaParams(mmproj_path=...): the engine evaluates the chunks in a slot, beside text-only requests."""
    import base64

    png = base64.b64encode(files["a.png"].read_bytes()).decode()
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}
    image_turn = [{"role": "user", "content": [image, {"type": "text", "text": "hello world"}]}]
    text_turn = [{"role": "user", "content": "hello world"}]
    reference = cli_text(native_tools, files, ["a.png"], "hello world", n_ctx=N_CTX["image"])
    params = lp.LlamaParams(model_path=files["text"], mmproj_path=files["image"], n_ctx=2 * N_CTX["image"],
                            n_seq_max=2, n_threads=THREADS)
    with lp.Llama.load(params) as llama:
        one = llama.create_chat_completion(image_turn, max_tokens=N_PREDICT)
        assert same_text(one.choices[0].message.content, reference), (one.choices[0].message.content, reference)
        text_alone = llama.create_chat_completion(text_turn, max_tokens=N_PREDICT).choices[0].message.content
        both = llama.create_chat_completions([image_turn, text_turn], max_tokens=N_PREDICT)
        assert [b.choices[0].message.content for b in both] == [one.choices[0].message.content, text_alone]
        assert one.usage.prompt_tokens > len(llama.tokenize("hello world"))  # the image's positions count


def test_image_parts_without_a_projector_say_what_to_set(files):
    with lp.Llama.load(lp.LlamaParams(model_path=files["text"], n_ctx=128, n_threads=THREADS)) as llama:
        with pytest.raises(lp.InvalidParameterError, match=r"mmproj_path=") as err:
            llama.create_chat_completion([{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": files["a.png"].as_uri()}}]}], max_tokens=2)
        assert err.value.field == "messages[0].content[0]"


def test_the_server_takes_image_parts(files):
    import base64

    import openai
    from llamaplug_testing import llamaplug_server

    png = base64.b64encode(files["a.png"].read_bytes()).decode()
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}
    messages = [{"role": "user", "content": [image, {"type": "text", "text": "hello world"}]}]
    with lp.Llama.load(lp.LlamaParams(model_path=files["text"], mmproj_path=files["image"], n_ctx=N_CTX["image"],
                                      n_threads=THREADS)) as llama:
        want = llama.create_chat_completion(messages, max_tokens=N_PREDICT).choices[0].message.content
    with llamaplug_server(files["text"], "--mmproj", str(files["image"]), "--parallel", "2", "-c",
                          str(2 * N_CTX["image"])) as (port, _):
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        got = client.chat.completions.create(model="text.gguf", messages=messages, max_tokens=N_PREDICT, temperature=0)
    assert want and got.choices[0].message.content == want
