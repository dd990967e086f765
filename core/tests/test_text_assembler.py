"""TextAssembler (pure Python): UTF-8 held across tokens, stop sequences held and cut."""

import random
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_incomplete_utf8_at_end_is_dropped_with_whole_chars():
    # a chat reply's (its parser reads whole characters); an invalid byte inside the text is still U+FFFD
    out = feed_all(TextAssembler(["STOP"], whole_chars=True), [b"x\xff", "☃".encode()[:2]])
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


class _Quadratic:
    """The assembler as it was (each token: every stop's every prefix against the text's end): the reference
    for what text comes out, on inputs small enough for its cost."""

    def __init__(self, stop):
        self.stop = [s for s in stop if s]
        self.text, self.emitted, self.stopped = "", 0, False

    def feed(self, piece):
        self.text += piece.decode()
        if self.stop:
            start = max(0, self.emitted - max(len(s) for s in self.stop) + 1)
            hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
            if hits:
                self.text, self.stopped = self.text[: min(hits)], True
                return self._emit(len(self.text))
        held = max((k for s in self.stop for k in range(1, min(len(s) - 1, len(self.text)) + 1)
                    if self.text.endswith(s[:k])), default=0)
        return self._emit(len(self.text) - held)

    def finish(self):
        return self._emit(len(self.text))

    def _emit(self, upto):
        upto = max(upto, self.emitted)
        out, self.emitted = self.text[self.emitted:upto], upto
        return out


@settings(max_examples=300, deadline=None)
@given(stops=st.lists(st.text("abc", min_size=1, max_size=6), max_size=5),
       pieces=st.lists(st.text("abc", max_size=4).map(str.encode), max_size=30))
def test_same_text_out_as_the_quadratic_assembler(stops, pieces):
    new, old = TextAssembler(stops), _Quadratic(stops)
    got = [new.feed(p) for p in pieces if not new.stopped]
    want = [old.feed(p) for p in pieces if not old.stopped]
    assert got + [new.finish()] == want + [old.finish()]
    assert new.stopped == old.stopped


def _lines_run(work):
    """Python lines executed in completion.py while `work()` runs: a count of steps, not a time."""
    lines = 0

    def local(frame, event, arg):
        nonlocal lines
        if event == "line":
            lines += 1
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename.endswith("completion.py") else None

    sys.settrace(tracer)
    try:
        work()
    finally:
        sys.settrace(None)
    return lines


def test_a_tokens_work_does_not_grow_with_the_number_or_length_of_stops():
    # The probe: 200 stops of 4,000 characters, 1,000 tokens (the old assembler: ~800,000 Python
    # steps a token, 18 s instead of 5 for the request). The text keeps starting stops and breaking off.
    rng = random.Random(7)
    pieces = ["".join(rng.choice("<>0123456789aaaa") for _ in range(rng.randint(1, 6))).encode()
              for _ in range(1000)]
    n_chars = sum(len(p) for p in pieces)
    many = [f"<{i}>" + "a" * (3996 - len(str(i))) for i in range(200)]
    assert all(len(s) == 3998 for s in many)

    def run(stops):
        a = TextAssembler(stops)
        return _lines_run(lambda: [a.feed(p) for p in pieces])

    few, lots = run(["<1>aa"]), run(many)
    assert lots <= 15 * n_chars + 20 * len(pieces)
    assert lots <= 2 * few
def test_the_stop_that_matched_is_kept_the_first_listed_of_a_tie():
    # llama-server's stopping_word: the stop found earliest in the text; of two found at the same place, the one
    # listed first (server-context.cpp's find_stopping_strings keeps a later one only at a smaller position)
    a = TextAssembler(["world", "lo w"])
    feed_all(a, [b"hello world"])
    assert a.matched == "lo w"
    for stops in (["ll", "l"], ["l", "ll"]):  # both are found at 2
        b = TextAssembler(stops)
        assert ("".join(feed_all(b, [b"hello world"])), b.matched) == ("he", stops[0])
    c = TextAssembler(["zz"])
    feed_all(c, [b"hello"])
    assert c.matched is None and not c.stopped
