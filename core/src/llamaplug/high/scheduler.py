"""The scheduler: what the engine's next step does, decided from the waiting jobs and the slots alone.

`schedule(waiting, slots, budget)` reads the jobs and slots (it changes neither, and touches
no model) and returns a `StepPlan`:

- drop: waiting jobs cancelled before they started;
- admit: which waiting job takes which free slot, in the admission policy's order (`Fifo`:
  arrival order, each job on the free slot sharing the longest prefix with its prompt);
- cancel: running jobs cancelled since the last step, to end before the batch is built;
- media: a slot whose media prompt is read this step (libmtmd decodes on its own: that is
  the whole step);
- decode: each generating slot's next token, and how many guesses a drafter may add after
  it (`drafts`, the rows reserved for them);
- prefill: prompt chunks in the room the generating slots leave, the prefilling slots
  taking turns at going first, so reading a long prompt never stalls running streams.

The engine acts on the plan: it places the admitted jobs (`Slot.place`, which may find a longer
prefix in the host store than the slot's own: a prefill then takes what is left of the prompt)
and the runner (runner.py) builds the batch, decodes it and hands each slot its rows. vLLM's
scheduler/worker split over llama-server's slots: the plan is data, so this module imports
neither the engine nor the runner.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from .prefix_store import common_prefix

if TYPE_CHECKING:
    from .job import Job
    from .slot import Slot


@dataclasses.dataclass(frozen=True)
class Budget:
    """What one step may hold: `tokens` batch rows (n_batch), `outputs` logits rows (n_outputs_max), and the
    guesses a drafter gives one sequence at most (`draft_max`; 0: no drafter)."""

    tokens: int
    outputs: int
    draft_max: int = 0


@dataclasses.dataclass(frozen=True)
class Prefill:
    """`n` tokens of the prompt `job` has left to read on `slot` (taken from the front of `slot.todo`)."""

    slot: Slot
    job: Job
    n: int


@dataclasses.dataclass
class StepPlan:
    """What one step does, in this order: drop, admit, cancel, then media alone, or decode (with drafts) and
    prefill in one batch. `turn`: give it to the next `schedule` (which prefilling slot goes first)."""

    drop: list[Job] = dataclasses.field(default_factory=list)
    admit: list[tuple[Job, Slot]] = dataclasses.field(default_factory=list)
    cancel: list[Slot] = dataclasses.field(default_factory=list)
    media: Slot | None = None
    decode: list[Slot] = dataclasses.field(default_factory=list)
    drafts: list[tuple[Slot, int]] = dataclasses.field(default_factory=list)  # (slot, most guesses it may add)
    prefill: list[Prefill] = dataclasses.field(default_factory=list)
    turn: int = 0

    @property
    def n_tokens(self) -> int:
        """Batch rows the plan takes at most (drafters may guess fewer)."""
        return len(self.decode) + sum(n for _, n in self.drafts) + sum(p.n for p in self.prefill)


class AdmissionPolicy(Protocol):
    """Which waiting job goes first, and which free slot it takes (a new policy goes here)."""

    def order(self, waiting: Sequence[Job]) -> Iterable[Job]: ...

    def pick(self, job: Job, free: Sequence[Slot]) -> Slot: ...


class Fifo:
    """Arrival order; the free slot whose tokens share the longest prefix with the prompt, else the one idle
    longest (llama-server's choice: its KV is reused, the least recently used is the one to lose)."""

    def order(self, waiting: Sequence[Job]) -> Iterable[Job]:
        return waiting

    def pick(self, job: Job, free: Sequence[Slot]) -> Slot:
        return max(free, key=lambda s: (common_prefix(s.tokens, job.prompt), -s.used))


FIFO = Fifo()


def schedule(waiting: Sequence[Job], slots: Sequence[Slot], budget: Budget, *, turn: int = 0,
             policy: AdmissionPolicy = FIFO) -> StepPlan:
    """The next step's plan for `waiting` jobs (oldest first) and the engine's `slots`; `turn` is the last plan's."""
    plan = StepPlan(turn=turn)
    free = [s for s in slots if s.job is None]
    admitted: dict[Slot, Job] = {}  # the job each slot takes
    for job in policy.order(waiting):
        if job.cancelled:
            plan.drop.append(job)
        elif free:
            slot = policy.pick(job, free)
            free.remove(slot)
            plan.admit.append((job, slot))
            admitted[slot] = job
    prefilling: list[tuple[Slot, Job, int]] = []  # (slot, job, prompt tokens left)
    for slot in slots:
        job = admitted.get(slot) or slot.job
        if job is None:
            continue
        if job.cancelled:
            if slot.job is job:
                plan.cancel.append(slot)
            continue  # (one just admitted and cancelled meanwhile ends at the next step)
        if job.media is not None and (slot.job is not job or (not slot.tokens and slot.next is None)):
            plan.media = plan.media or slot  # evaluated whole, from position 0 (Slot.place keeps nothing)
        elif slot.job is not job:
            prefilling.append((slot, job, len(job.prompt) - _kept(slot, job)))
        elif slot.next is not None:
            plan.decode.append(slot)
        elif slot.todo:
            prefilling.append((slot, job, len(slot.todo)))
    if plan.media is not None:
        plan.decode, prefilling = [], []  # libmtmd's decodes are this step
    used = len(plan.decode)
    if budget.draft_max > 0:
        used += _plan_drafts(plan, budget, len(prefilling))
    if prefilling:
        plan.turn = (turn + 1) % len(prefilling)
        prefilling = prefilling[plan.turn:] + prefilling[:plan.turn]
    for slot, job, todo in prefilling:
        room = budget.tokens - used
        if room <= 0:
            break
        n = min(todo, room)
        plan.prefill.append(Prefill(slot, job, n))
        used += n
    return plan


def _kept(slot: Slot, job: Job) -> int:
    """The prompt tokens `Slot.place` keeps of what the slot holds (the host store may give it more)."""
    return min(common_prefix(slot.tokens, job.prompt), len(job.prompt) - 1)


def _plan_drafts(plan: StepPlan, budget: Budget, n_prefilling: int) -> int:
    """Room for guesses after each text slot's next token: the batch and logits rows the step's other tokens
    leave, shared evenly (as llama.cpp: room in the sequence for the next token and one sampled after the last
    guess); the rows reserved."""
    asking = [s for s in plan.decode if s.job is not None and s.job.media is None]
    if not asking:
        return 0
    n = len(plan.decode)
    share = min(budget.tokens - n, budget.outputs - n - n_prefilling) // len(asking)
    reserved = 0
    for slot in asking:
        job = slot.job
        assert job is not None
        n_max = min(share, budget.draft_max, slot.room() - 2, slot.limit() - job.produced - 1)
        if n_max > 0:
            plan.drafts.append((slot, n_max))
            reserved += n_max
    return reserved
