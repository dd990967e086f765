"""TextAssembler (pure Python): UTF-8 held across tokens, stop sequences held and cut."""

from llamaplug.high.completion import TextAssembler


def feed_all(assembler, pieces):
    return [assembler.feed(p) for p in pieces] + [assembler.finish()]


def test_split_utf8_is_held_until_complete():
    snowman = "☃".encode()
    out = feed_all(TextAssembler([]), [b"a", snowman[:1], snowman[1:2], snowman[2:], b"b"])
    assert out == ["a", "", "", "☃", "b", ""]


def test_incomplete_utf8_at_end_becomes_replacement():
    out = feed_all(TextAssembler([]), [b"x", "☃".encode()[:2]])
    assert "".join(out) == "x\ufffd"


def test_stop_straddling_pieces_is_cut_and_never_emitted():
    a = TextAssembler(["STOP"])
    out = feed_all(a, [b"hello S", b"T", b"OP and more"])
    assert "".join(out) == "hello "
    assert a.stopped
    assert out[0] == "hello "  # "S" is held: it may start "STOP"


def test_held_prefix_released_when_not_a_stop():
    a = TextAssembler(["STOP"])
    out = feed_all(a, [b"ST", b"ART"])
    assert out == ["", "START", ""] and not a.stopped


def test_earliest_of_several_stops_wins():
    a = TextAssembler(["world", "lo w"])
    assert "".join(feed_all(a, [b"hello world"])) == "hel"
