"""The engine's scheduler (high/scheduler.py) without a model: `schedule` reads jobs and slots and returns a plan.

The slots are real `Slot`s over a stand-in context that only tells the sequence length (the scheduler reads their
bookkeeping: tokens, todo, next, used); a step is played by `Slot.consumed` and by setting `next`, as the runner
and `Slot.advance` would.
"""

from __future__ import annotations

import types

from llamaplug.high.job import Job
from llamaplug.high.scheduler import Budget, Fifo, schedule
from llamaplug.high.slot import Slot

N_CTX_SEQ = 512


def slots(n: int) -> list[Slot]:
    context = types.SimpleNamespace(n_ctx_seq=N_CTX_SEQ)
    return [Slot(i, context, None) for i in range(n)]  # type: ignore[arg-type]


def job(prompt: list[int], max_tokens: int | None = 16) -> Job:
    return Job(list(prompt), max_tokens, None, [])  # type: ignore[arg-type]


def running(slot: Slot, j: Job, *, generating: bool = True, tokens: list[int] | None = None) -> Job:
    """Put `j` on `slot` as the engine would have: its prompt read (`generating`) or not read at all."""
    slot.job = j
    slot.tokens = list(tokens if tokens is not None else j.prompt) if generating else list(tokens or [])
    slot.todo = [] if generating else j.prompt[len(slot.tokens):]
    slot.next = 7 if generating else None
    return j


def test_waiting_jobs_take_free_slots_in_arrival_order_and_the_rest_wait():
    s = slots(2)
    waiting = [job([1, 2]), job([3, 4]), job([5, 6])]
    plan = schedule(waiting, s, Budget(64, 8))
    assert [j for j, _ in plan.admit] == waiting[:2]
    assert {slot.seq for _, slot in plan.admit} == {0, 1}
    assert waiting == waiting[:3] and not plan.drop  # the third waits; schedule changes nothing it is given
    assert sorted((p.slot.seq, p.n) for p in plan.prefill) == [(0, 2), (1, 2)]  # both prompts fit this step


def test_no_free_slot_admits_nothing_and_a_cancelled_waiting_job_is_dropped():
    s = slots(1)
    running(s[0], job([1, 2, 3]))
    waiting = [job([4, 5]), job([6, 7])]
    waiting[1].cancel()
    plan = schedule(waiting, s, Budget(64, 8))
    assert plan.admit == [] and plan.drop == [waiting[1]]
    assert plan.decode == [s[0]] and plan.prefill == []


def test_a_job_takes_the_free_slot_sharing_the_longest_prefix_then_the_one_idle_longest():
    s = slots(3)
    s[0].tokens, s[0].used = [1, 2, 3], 3.0
    s[1].tokens, s[1].used = [5, 6, 7, 8], 2.0
    s[2].tokens, s[2].used = [9], 1.0
    plan = schedule([job([5, 6, 9, 9])], s, Budget(64, 8))
    assert [slot.seq for _, slot in plan.admit] == [1]
    # the slot keeps [5, 6]: only the rest of the prompt is planned
    assert [(p.slot.seq, p.n) for p in plan.prefill] == [(1, 2)]
    # no slot shares anything: the one idle longest (smallest `used`)
    plan = schedule([job([4, 4])], s, Budget(64, 8))
    assert plan.admit[0][1] is s[2]
    # the whole prompt in the slot: its last token is read again, for its logits
    plan = schedule([job([1, 2, 3])], s, Budget(64, 8))
    assert plan.admit[0][1] is s[0] and plan.prefill[0].n == 1


def test_generating_slots_come_first_and_prompts_get_the_room_left():
    s = slots(3)
    running(s[0], job([1, 2]))
    running(s[1], job([3, 4]))
    plan = schedule([job(list(range(100, 130)))], s, Budget(10, 8))
    assert plan.decode == [s[0], s[1]]
    assert [(p.slot, p.n) for p in plan.prefill] == [(s[2], 8)]
    assert plan.n_tokens == 10


def test_a_long_prompt_is_read_in_chunks_across_steps():
    s = slots(1)
    j = job(list(range(100, 125)))
    plan = schedule([j], s, Budget(10, 8))
    assert plan.admit == [(j, s[0])] and [p.n for p in plan.prefill] == [10]
    running(s[0], j, generating=False)  # what Slot.place does with nothing kept
    chunks = [10]
    s[0].consumed(10)
    while s[0].todo:
        plan = schedule([], s, Budget(10, 8), turn=plan.turn)
        assert plan.admit == [] and plan.decode == []
        (chunk,) = plan.prefill
        chunks.append(chunk.n)
        s[0].consumed(chunk.n)
    assert chunks == [10, 10, 5] and s[0].tokens == j.prompt


def test_prefilling_slots_take_turns_at_going_first():
    s = slots(2)
    for slot, base in zip(s, (100, 200)):
        running(slot, job(list(range(base, base + 40))), generating=False)
    firsts = []
    turn = 0
    for _ in range(4):
        plan = schedule([], s, Budget(16, 8), turn=turn)
        turn = plan.turn
        firsts.append(plan.prefill[0].slot.seq)
        assert [p.n for p in plan.prefill] == [16]  # the first takes the whole room
    assert firsts == [1, 0, 1, 0]


def test_drafts_are_planned_only_for_generating_slots_within_the_budget():
    s = slots(3)
    running(s[0], job([1, 2, 3]))
    running(s[1], job([4, 5, 6]), generating=False)
    plan = schedule([], s, Budget(64, 8, draft_max=4), turn=0)
    assert plan.decode == [s[0]] and plan.drafts == [(s[0], 4)]
    # the guesses' rows are reserved before the prompt's: 1 next token + 4 guesses
    assert [(p.slot, p.n) for p in plan.prefill] == [(s[1], 3)]
    assert plan.n_tokens == 1 + 4 + 3
    # without a drafter, none
    assert schedule([], s, Budget(64, 8)).drafts == []
    # the logits rows bound them: 8 outputs, 2 generating, 1 prefilling: 5 left, 2 each
    running(s[2], job([7, 8, 9]))
    plan = schedule([], s, Budget(64, 8, draft_max=4))
    assert plan.drafts == [(s[0], 2), (s[2], 2)]


def test_a_draft_never_passes_the_jobs_max_tokens():
    s = slots(1)
    j = running(s[0], job([1, 2, 3], max_tokens=4))
    j.produced = 2  # one more to decode after `next`: room for one guess
    assert schedule([], s, Budget(64, 16, draft_max=8)).drafts == [(s[0], 1)]
    j.produced = 3
    assert schedule([], s, Budget(64, 16, draft_max=8)).drafts == []


def test_cancelled_running_jobs_end_before_the_batch_and_media_is_a_step_of_its_own():
    s = slots(3)
    cancelled = running(s[0], job([1, 2]))
    cancelled.cancel()
    running(s[1], job([3, 4]))
    media = job([])
    media.media = types.SimpleNamespace(n_pos=5)
    plan = schedule([media], s, Budget(64, 8))
    assert plan.cancel == [s[0]] and plan.admit == [(media, s[2])]
    assert plan.media is s[2] and plan.decode == [] and plan.prefill == []


def test_the_admission_policy_is_a_seam():
    class Newest(Fifo):
        def order(self, waiting):
            return list(reversed(waiting))

    s = slots(1)
    waiting = [job([1]), job([2])]
    assert schedule(waiting, s, Budget(64, 8), policy=Newest()).admit == [(waiting[1], s[0])]
