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


def test_the_stop_that_matched_is_kept_the_first_listed_of_a_tie():
    # llama-server's stopping_word: the stop found earliest in the text; of two found at the same place, the one
    # listed first (server-context.cpp's find_stopping_strings keeps a later one only at a smaller position)
    a = TextAssembler(["world", "lo w"])
    feed_all(a, [b"hello world"])
    assert a.matched == "lo w"
    for stops in (["ll", "l"], ["l", "ll"]):  # both are found at 2
        b = TextAssembler(stops)
        feed_all(b, [b"hello world"])
        assert (b.text, b.matched) == ("he", stops[0])
    c = TextAssembler(["zz"])
    feed_all(c, [b"hello"])
    assert c.matched is None and not c.stopped
