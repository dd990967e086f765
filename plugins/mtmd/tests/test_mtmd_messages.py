"""Chat messages with image_url / input_audio parts -> (text with markers, media), as llama.cpp's server does it."""

from __future__ import annotations

import base64

import pytest
from fixtures.tiny_mmproj import png_bytes, sample_image
from llamaplug_mtmd import DEFAULT_MARKER as M
from llamaplug_mtmd import MediaDecodeError, UnsupportedMediaError, has_media, split_media

import llamaplug as lp

PNG = png_bytes(sample_image())
DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()


def test_parts_become_markers_joined_as_llama_cpp_joins_them():
    messages = [
        {"role": "system", "content": "plain text stays"},
        {"role": "user", "content": [
            {"type": "text", "text": "look:"},
            {"type": "image_url", "image_url": {"url": DATA_URL}},
            {"type": "text", "text": "and"},
            {"type": "text", "text": "listen"},
            {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"RIFF....WAVEfmt ").decode(),
                                                    "format": "wav"}},
        ]},
    ]
    assert has_media(messages) and not has_media(messages[:1])
    flat, media = split_media(messages, M)
    assert flat[0] == messages[0]
    # newline between text parts, none before or after a marker (common/chat.cpp concat_content_parts)
    assert flat[1] == {"role": "user", "content": f"look:{M}and\nlisten{M}"}
    assert [(m.kind, m.where) for m in media] == [("image", "messages[1].content[1]"),
                                                  ("audio", "messages[1].content[4]")]
    assert media[0].data == PNG


def test_url_forms(tmp_path):
    path = tmp_path / "x.png"
    path.write_bytes(PNG)
    for url in (DATA_URL, path.as_uri(), base64.b64encode(PNG).decode()):
        _, media = split_media([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}], M)
        assert media[0].data == PNG, url
    _, media = split_media([{"role": "user", "content": [{"type": "image_url", "image_url": DATA_URL}]}], M)
    assert media[0].data == PNG  # the bare-string shape some clients send
    with pytest.raises(UnsupportedMediaError, match="outside the allowed media folder"):
        split_media([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": path.as_uri()}}]}], M,
                    media_root=tmp_path / "elsewhere")


@pytest.mark.parametrize("part, error, match", [
    ({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}, UnsupportedMediaError, "not fetched"),
    ({"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGk="}}, UnsupportedMediaError, "data:image"),
    ({"type": "image_url", "image_url": {"url": "data:image/png,rawbytes"}}, MediaDecodeError, "base64"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}, MediaDecodeError, "not valid base64"),
    ({"type": "image_url", "image_url": {"url": "file:///no/such/file.png"}}, MediaDecodeError, "cannot read"),
    ({"type": "image_url", "image_url": {}}, lp.InvalidParameterError, "no url"),
    ({"type": "input_audio", "input_audio": "abc"}, lp.InvalidParameterError, "input_audio must be an object"),
    ({"type": "video", "video": {}}, lp.InvalidParameterError, "unsupported content part type 'video'"),
])
def test_bad_parts(part, error, match):
    with pytest.raises(error, match=match) as info:
        split_media([{"role": "user", "content": [part]}], M)
    assert isinstance(info.value, lp.LlamaError) and "messages[0].content[0]" in str(info.value)
