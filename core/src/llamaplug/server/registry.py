"""The models a server serves, by the name a request gives in its `model` field, and their lifecycle.

Every route finds its model through `ModelRegistry.lease` (deps.py): a model that is
not loaded is loaded then (off the event loop, in a thread; the requests that arrive
meanwhile wait for that one load, and the other models keep serving), and a model is
never closed while a lease on it is held. Around that:

- `max_loaded` (llama-server's --models-max, Ollama's OLLAMA_MAX_LOADED_MODELS): a load
  that would pass it first unloads the least recently used model, once that one's
  requests are done (new requests for it wait, then load it again); a load whose requests all
  left before it began (`lease`'s `gone`: their clients went away) is called off, and so is the
  unload it was waiting for, as llama-server's queue: that model stays, serving its requests;
- keep-alive (Ollama's `keep_alive`): a model idle that long is unloaded; a request may
  set its model's keep-alive (0: unload after it, negative: never);
- sleep (`sleep_idle`): a model idle that long is unloaded but stays listed as sleeping;
- `max_queue` (Ollama's OLLAMA_MAX_QUEUE): a request that would be the N+1th waiting (for
  a load, or for a slot of its model) is refused with a 503 instead of queueing;
- a model whose engine stopped for good (Engine.failure: a bug it could not go on from) is
  unloaded and loaded again by itself; `down` names it meanwhile (/health answers 503), and
  its requests wait for the new load;
- `router` (llama-server's router mode: several models, a --models-dir or a --models-preset):
  GET /props without `model` describes the router (and LLAMA_SERVER_DEBUG_FAKE_TIMING makes each
  load and each lease 2 s longer, as it makes llama-server's router: fake_timing.py); a
  --models-preset file's models (presets.py) are served with the others, one named as a command
  line model taking its place, and `reload_presets` (GET /models?reload=1) reads the file
  again: a model gone from it is unloaded and forgotten, a changed one unloaded and served with
  its new settings, a new one added; `hidden` are the models its dedup-cache-models leaves out
  of GET /models.

All of this state lives on the event loop's thread; only Llama.load and Llama.close run
in threads. Apart: what a model is served as and its lifecycle record (served.py), the idle
timers (keep_alive.py), the queue's bound (queue_limit.py), glibc's allocator tuned for models
that come and go (allocator.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any

from ..errors import InvalidParameterError, LlamaError
from ..high.chat import ChatSpec
from ..high.chat_call import ChatCall, start_chat
from ..high.engine import Engine
from ..high.llama import Llama
from ..high.template_probe import probe_chat_template
from ..params import LlamaParams
from . import allocator, fake_timing
from .api_error import (
    ModelExistsError,
    ModelLoadError,
    ModelNotAutoloadedError,
    ModelNotLoadedError,
    ModelNotServedError,
    ModelPinnedError,
    NoRoomError,
)
from .chat_settings import ChatSettings
from .keep_alive import IdleTimers, parse_keep_alive
from .model_specs import ModelSpec, load_failure
from .preload import load_warmed
from .presets import PresetError, PresetModels
from .queue_limit import DEFAULT_MAX_QUEUE, QueueLimit
from .served import ModelEntry, ModelState, Served, own_pooling
from .streaming import unless

log = logging.getLogger("llamaplug.server.registry")

__all__ = ["DEFAULT_MAX_QUEUE", "ModelRegistry", "ModelSpec", "ModelState", "Served", "check_template", "load_warm",
           "parse_keep_alive", "warm_chat"]


def load_warm(params: LlamaParams) -> Llama:
    """Llama.load, then what a fresh model's first requests would pay, paid before it is ready: its warm-up
    decode, and its chat template compiled (jinja2 imported and the template cached, by one chat prompt built)."""
    return warm_chat(load_warmed(params))


def warm_chat(llama: Llama) -> Llama:
    """Build one chat prompt, so that jinja2 is imported and the model's template compiled before it serves."""
    try:
        run = start_chat(llama, ChatCall(ChatSpec([{"role": "user", "content": "hi"}]), max_tokens=1))
    except LlamaError:  # a template that does not render fails the chat requests themselves, with their error
        log.debug("no chat prompt to warm up with", exc_info=True)
    else:
        run.close()  # (never run)
    return llama


def check_template(llama: Llama, chat_template: str | None) -> None:
    """The chat template `llama` will serve with, compiled and rendered once (high.template_probe): one that does
    not compile or passes a bound of the renderer fails the load here, not a request; `llama` is closed then."""
    if not isinstance(llama, Llama):  # a stand-in a loader gave (the registry's own tests): no template to try
        return
    try:
        probe_chat_template(llama, chat_template)
    except BaseException:
        _close(llama)
        raise


def name_forms(name: str) -> tuple[str, ...]:
    """The names a request's `name` may mean, as Ollama's clients and llama-server's write a model: as given,
    without Ollama's ":latest", without or with a file's ".gguf" ("alpha", "alpha:latest", "alpha.gguf" and
    "alpha.gguf:latest" all name the model served as alpha, or as alpha.gguf)."""
    base = name.removesuffix(":latest")
    stem = base[:-5] if base.lower().endswith(".gguf") else base
    return tuple(dict.fromkeys((name, base, stem, f"{stem}.gguf")))


class ModelRegistry:
    """The served models, the first being the one a request without `model` gets."""

    def __init__(self, models: list[Served] | None = None, specs: list[ModelSpec] | None = None, *,
                 max_loaded: int | None = None, keep_alive: float | None = None, sleep_idle: float | None = None,
                 max_queue: int = DEFAULT_MAX_QUEUE, loader: Callable[[LlamaParams], Llama] | None = None,
                 chat: ChatSettings | None = None, autoload: bool = True, router: bool = False,
                 presets: tuple[Callable[[], PresetModels], PresetModels] | None = None):
        if max_loaded is not None and max_loaded < 1:
            raise InvalidParameterError(f"max_loaded (--max-loaded) must be at least 1, not {max_loaded}",
                                        field="max_loaded")
        self.chat = chat or ChatSettings()  # the server's chat defaults (given models keep their own)
        self._entries: dict[str, ModelEntry] = {}
        self._names: dict[str, ModelEntry] = {}  # ids and aliases
        for entry in [ModelEntry(None, s) for s in models or []] + [ModelEntry(s, None) for s in specs or []]:
            for name in (entry.id, *entry.aliases):
                if name in self._names:
                    raise InvalidParameterError(f"two served models are named {name!r}: give one another alias",
                                                field="alias")
                self._names[name] = entry
            self._entries[entry.id] = entry
        self.router = router or presets is not None
        self._fake_delay = fake_timing.delay() if self.router else 0.0  # (llama-server's router's debug knob)
        self.hidden: frozenset[str] = frozenset()  # listed by no GET /models (dedup-cache-models)
        self._read_presets = presets[0] if presets is not None else None
        self._preset_ids: set[str] = set()
        self._given: dict[str, ModelSpec] = {}  # command line models a preset of the same id took the place of
        if presets is not None:
            self._take_presets(presets[1])
        if not self._entries and presets is None:
            raise InvalidParameterError("a registry needs at least one model", field="models")
        self.max_loaded = max_loaded
        self._idle = IdleTimers(keep_alive, sleep_idle, self._unload, self._background)
        if specs and (len(self._entries) > 1 or keep_alive is not None or sleep_idle is not None):
            allocator.map_big_buffers()  # models will come and go
        self._queue = QueueLimit(max_queue)
        self.autoload = autoload  # False (--no-models-autoload): only POST /models/load loads an unloaded model
        self._loader = loader or load_warm
        self._room: asyncio.Lock | None = None  # one eviction decision at a time (made on first use: needs a loop)
        self._unload_hooks: list[Callable[[str, Engine], None]] = []
        self._sleep_hooks: list[Callable[[str, Served], None]] = []
        self._tasks: set[asyncio.Task[None]] = set()  # idle unloads and reloads under way
        self._loop: asyncio.AbstractEventLoop | None = None  # the server's, once a request came (engine-stop hooks)

    # -- what is served ----------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Served]:
        """The loaded models."""
        return iter([e.served for e in self._entries.values() if e.served is not None])

    def names(self) -> list[str]:
        """The id of every model, loaded or not, the default one first."""
        return list(self._entries)

    def listed(self) -> list[str]:
        """The ids GET /models lists: every model's but those a preset's dedup-cache-models hides (still served)."""
        return [name for name in self._entries if name not in self.hidden]

    def is_preset(self, name: str) -> bool:
        """Whether the model named `name` is one of the --models-preset file's."""
        return self._entry(name).id in self._preset_ids

    def describe(self, name: str) -> tuple[str, ModelState, int, tuple[str, ...]]:
        """(id, state, created, aliases) of the model named `name` (an id or an alias; 404 if none)."""
        e = self._entry(name)
        return e.id, e.state, e.created, e.aliases

    def labels(self, name: str) -> tuple[list[str], list[str]]:
        """(aliases, tags) that /v1/models shows for the model named `name`, as llama-server lists them: every
        name -a gave (the id too), and --tags."""
        e = self._entry(name)
        if e.spec is None:
            return list(e.aliases), []
        names = sorted({e.id, *e.aliases}) if e.spec.named else list(e.aliases)
        return names, list(e.spec.tags)

    def multimodal(self, name: str) -> bool:
        """Whether the model named `name` takes images or audio: its projector is open, or (not loaded) its
        spec names one."""
        e = self._entry(name)
        if e.served is not None:
            return e.served.llama.projector is not None
        return e.spec is not None and e.spec.params.mmproj_path is not None

    def chat_template(self, name: str) -> str | None:
        """The chat template the model named `name` is served with in place of its GGUF's (models.toml's or
        --chat-template: Jinja text or a template's name); None: the GGUF's own."""
        e = self._entry(name)
        if e.served is not None:
            return e.served.chat_template
        return e.spec.chat_template if e.spec is not None else None

    def engines(self) -> list[tuple[str, Engine]]:
        """(id, engine) of each loaded model (for /metrics)."""
        return [(e.id, e.served.llama.engine) for e in self._entries.values() if e.served is not None]

    def on_unload(self, hook: Callable[[str, Engine], None]) -> None:
        """Call `hook(id, engine)` before a model's engine closes (metrics keep its counters)."""
        self._unload_hooks.append(hook)

    def on_sleep(self, hook: Callable[[str, Served], None]) -> None:
        """Call `hook(id, served)` before a model going to sleep (--sleep-idle) closes: what a sleeping model
        still answers (its /props) is read from it then."""
        self._sleep_hooks.append(hook)

    def sleeping(self, name: str | None) -> str | None:
        """The id of the model `name` names (a request's `model`: lenient) if it sleeps, else None."""
        entry = self._entry(name, lenient=True)
        return entry.id if entry.state is ModelState.SLEEPING and entry.served is None else None

    def resolve(self, name: str | None) -> Served:
        """The loaded model named `name` (None: the default one); 404 for an unknown name, 503 for one not loaded."""
        entry = self._entry(name, lenient=True)
        if entry.served is None or entry.state is not ModelState.LOADED:
            raise ModelNotLoadedError(f"model {entry.id!r} is {entry.state.value}", param="model")
        return entry.served

    def _entry(self, name: str | None, lenient: bool = False) -> ModelEntry:
        """The model `name` names. `lenient` (a request's `model`): llama-server's single-model leniency, where
        with one model served any name gets it, so clients that must send some `model` ("gpt-4o-mini") work
        unchanged; with several, an unknown name stays a 404."""
        if not self._entries:
            raise ModelNotServedError("no model is served here (the --models-preset file names none)",
                                      param="model")
        if name is None or (lenient and len(self._entries) == 1):
            return next(iter(self._entries.values()))
        for candidate in name_forms(name):
            found = self._names.get(candidate)
            if found is not None:
                return found
        have = ", ".join(repr(n) for n in self._entries)
        raise ModelNotServedError(f"model {name!r} is not served here (this server has {have})",
                                  param="model") from None

    # -- leases ------------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lease(self, name: str | None, keep_alive: float | None = None,
                    gone: Callable[[], Awaitable[None]] | None = None) -> AsyncIterator[Served]:
        """The model named `name`, loaded (loading it if need be), kept loaded until the block ends.

        `keep_alive` (seconds; 0: unload after this request, negative: never) becomes the model's own, where
        several models are served: a server of one model keeps it loaded whatever a request says (with nothing
        to make room for, an unload only made every client wait for the reload).
        `gone()`: ends when the request's client goes away; a request waiting for its model's load then stops
        waiting (ClientGoneError, 499), and a load nobody waits for any more is called off (`_unless_abandoned`).
        """
        entry = self._entry(name, lenient=True)
        if not self.autoload and entry.state is ModelState.UNLOADED and entry.loading is None:
            raise ModelNotAutoloadedError(f"model {entry.id!r} is not loaded, and this server loads a model only when "
                                          f"told (--no-models-autoload): POST /models/load {{\"model\": "
                                          f"\"{entry.id}\"}} first", param="model")
        served = await self._acquire(entry, gone)
        if keep_alive is not None and len(self._entries) > 1:
            entry.keep_alive = keep_alive
        try:
            if self._fake_delay:  # as llama-server's router: after the model counts this request as busy
                await asyncio.sleep(self._fake_delay)
            yield served
        finally:
            entry.users -= 1
            entry.last_used = time.monotonic()
            entry.changed()
            self._idle.start(entry)

    async def _acquire(self, entry: ModelEntry, gone: Callable[[], Awaitable[None]] | None = None) -> Served:
        self._loop = asyncio.get_running_loop()
        self._revive_if_stopped(entry)
        self._drop_if_lost(entry)
        if entry.state is ModelState.LOADED and entry.unloading is None:
            assert entry.served is not None
            self._check_queue(entry.users >= entry.served.llama.engine.n_slots)  # would it wait for a slot?
            return self._take(entry)
        self._check_queue(True)
        if gone is None:
            return await self._wait_loaded(entry)
        # (a wait called off stops before it takes a lease)
        return await unless(gone(), self._wait_loaded(entry),
                            f"the client went away while its request waited for model {entry.id!r}")

    async def _wait_loaded(self, entry: ModelEntry) -> Served:
        """Wait for `entry` to be loaded (starting its load if none runs), then take a lease on it."""
        self._queue.loading += 1
        try:
            while True:
                if entry.unloading is not None:
                    await asyncio.shield(entry.unloading)
                    continue
                if entry.state is ModelState.LOADED:
                    return self._take(entry)
                await self._join_load(entry)
                # The load that ended gave this request its place: an eviction waits for wanted == 0, so the
                # model is still loaded here, whatever ran in between.
                if entry.state is ModelState.LOADED:
                    return self._take(entry)
        finally:
            self._queue.loading -= 1

    async def _join_load(self, entry: ModelEntry) -> None:
        """Wait for `entry`'s load (started here if none runs), counted in `wanted` so that it is not called off
        while this waits for it."""
        if entry.loading is None:
            entry.loading = asyncio.ensure_future(self._load(entry))
        entry.wanted += 1
        entry.changed()
        try:
            await asyncio.shield(entry.loading)
        finally:
            entry.wanted -= 1
            entry.changed()

    def _drop_if_lost(self, entry: ModelEntry) -> None:
        """A model whose RPC server's connection broke cannot decode again (its weights were there): unload it,
        once the requests on it have failed, so that this request loads it anew (Llama.load checks the server
        first: while it is down, the load is the request's error)."""
        served = entry.served
        if entry.spec is None or served is None or entry.unloading is not None:
            return
        lost = served.llama.context.backend_lost
        if lost:
            log.warning("%s lost its RPC server %s: unloading it, the next request loads it again", entry.id, lost)
            entry.unloading = asyncio.ensure_future(self._drain_and_close(entry, ModelState.UNLOADED))

    def down(self) -> list[str]:
        """The models that are down since their engine stopped (being loaded again), for /health."""
        for entry in list(self._entries.values()):
            self._revive_if_stopped(entry)
        return [e.id for e in self._entries.values() if e.down]

    def _watch(self, entry: ModelEntry, llama: Llama) -> None:
        """Reload `entry` by itself if the engine of `llama` stops for good."""

        def stopped(_: BaseException) -> None:  # on the engine's thread
            loop = self._loop  # none yet: no request came, so none ran on it; `down` and leases look too
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self._revive_if_stopped, entry)

        llama.engine.on_stop(stopped)

    def _revive_if_stopped(self, entry: ModelEntry) -> None:
        served = entry.served
        if served is None or served.llama.engine.failure is None or entry.unloading is not None:
            return
        if not entry.down:
            log.error("%s: its engine stopped (%s)%s", entry.id, served.llama.engine.failure,
                      "; loading it again" if entry.spec is not None else "")
        entry.down = True
        if entry.spec is None:  # given loaded: not the registry's to load again
            return
        entry.unloading = asyncio.ensure_future(self._drain_and_close(entry, ModelState.UNLOADED))
        self._background(self._reload(entry), "a reload after the engine stopped")

    async def _reload(self, entry: ModelEntry) -> None:
        await self._unload(entry, ModelState.UNLOADED)
        if self._entries.get(entry.id) is entry and entry.state is not ModelState.LOADED:  # (not removed)
            await self.load(entry.id)

    def _take(self, entry: ModelEntry) -> Served:
        self._idle.cancel(entry)
        entry.users += 1
        entry.last_used = time.monotonic()
        entry.changed()
        assert entry.served is not None
        return entry.served

    def _check_queue(self, would_wait: bool) -> None:
        if would_wait:
            self._queue.check(sum(e.waiting() for e in self._entries.values()))

    # -- loading and unloading ---------------------------------------------------------------------------
    def preload(self, name: str, llama: Llama | None = None) -> Served:
        """Load the model named `name` before serving (no event loop yet): its load errors raise here.

        `llama`: that model already loaded and warmed up (`llamaplug serve` starts the load before it imports the
        registry and the web stack); its chat template is compiled here."""
        entry = self._entry(name)
        assert entry.spec is not None and entry.served is None
        llama = self._loader(entry.spec.params) if llama is None else warm_chat(llama)
        check_template(llama, entry.spec.chat_template)
        entry.served = Served(entry.id, llama, entry.spec.pooling or own_pooling(llama), entry.created,
                              entry.spec.chat_template, self.chat, entry.spec.sampling)
        entry.state = ModelState.LOADED
        self._watch(entry, llama)
        return entry.served

    def idle_from_now(self) -> None:
        """At the server's start (in its event loop): the idle timers of the models loaded before it, so that one
        nobody asks for sleeps (or unloads) that long after the start, as llama-server's --sleep-idle-seconds."""
        for entry in self._entries.values():
            self._idle.start(entry)

    async def load(self, name: str) -> Served:
        """Load the model named `name` now (if it is not loaded), as a request for it would."""
        entry = self._entry(name)
        self._queue.loading += 1
        try:
            while entry.state is not ModelState.LOADED or entry.unloading is not None:
                if entry.unloading is not None:
                    await asyncio.shield(entry.unloading)
                    continue
                await self._join_load(entry)
        finally:
            self._queue.loading -= 1
        self._idle.start(entry)
        assert entry.served is not None
        return entry.served

    async def unload(self, name: str, state: ModelState = ModelState.UNLOADED) -> None:
        """Unload the model named `name` once its requests are done (a running load first ends)."""
        entry = self._entry(name)
        if entry.spec is None:
            raise ModelPinnedError(f"model {entry.id!r} was given loaded and cannot be unloaded", param="model")
        if entry.loading is not None:
            await asyncio.shield(entry.loading)
        await self._unload(entry, state)

    async def _load(self, entry: ModelEntry) -> None:
        assert entry.spec is not None
        before = entry.state
        entry.state = ModelState.LOADING
        try:
            if self._room is None:
                self._room = asyncio.Lock()
            room = self._room if self.max_loaded is not None else None
            if not await self._unless_abandoned(entry, self._prepare(entry, room)):
                entry.state = before
                log.info("load of %s called off: no request waits for it any more", entry.id)
                return
            try:  # (`room` held: `_prepare` took it)
                spec = entry.spec
                log.info("loading %s (%s)", spec.id, spec.params.model_path)
                llama = await asyncio.to_thread(self._loader, spec.params)
                await asyncio.to_thread(check_template, llama, spec.chat_template)
                entry.served = Served(spec.id, llama, spec.pooling or own_pooling(llama), entry.created,
                                      spec.chat_template, self.chat, spec.sampling)
                entry.state = ModelState.LOADED
                entry.down = False
                entry.last_used = time.monotonic()
                self._watch(entry, llama)
            finally:
                if room is not None:
                    room.release()
        except LlamaError as exc:
            entry.state = before
            log.error("model %r failed to load: %s", entry.id, exc)  # the client's error says no server path
            raise ModelLoadError(f"model {entry.id!r} failed to load: {load_failure(exc, entry.spec.params)}",
                                 param="model") from exc
        except BaseException:
            entry.state = before
            raise
        finally:
            entry.loading = None

    async def _prepare(self, entry: ModelEntry, room: asyncio.Lock | None) -> None:
        """What comes before `entry`'s load and may still be called off: its turn (`room`, taken here and held
        on return), room made for it, and llama-server's fake load time."""
        if room is not None:
            await room.acquire()
        try:
            await self._make_room(entry)
            if self._fake_delay:  # as llama-server's router: each load takes that much longer
                await asyncio.sleep(self._fake_delay)
        except BaseException:
            if room is not None:
                room.release()
            raise

    @staticmethod
    async def _unless_abandoned(entry: ModelEntry, work: Coroutine[Any, Any, None]) -> bool:
        """Run `work` unless every request waiting for `entry`'s load leaves first (no lease, none waiting:
        their clients went away); then `work` is cancelled and this says False."""
        task = asyncio.ensure_future(work)
        try:
            while not task.done():
                if entry.users == 0 and entry.wanted == 0:
                    task.cancel()
                    await asyncio.wait({task})
                    if task.cancelled():
                        return False
                    break  # it ended before the cancel reached it: the load goes on
                nobody = asyncio.ensure_future(entry.drained.wait())
                try:
                    await asyncio.wait({task, nobody}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    nobody.cancel()
        finally:
            task.cancel()  # (a no-op once it is done: here only when this task itself was cancelled)
        task.result()
        return True

    async def _make_room(self, entry: ModelEntry) -> None:
        """Unload least recently used models until loading `entry` stays within max_loaded."""
        while self.max_loaded is not None:
            closing = [e.unloading for e in self._entries.values() if e.unloading is not None]
            if closing:  # its memory is not free yet
                await asyncio.shield(closing[0])
                continue
            loaded = [e for e in self._entries.values() if e is not entry and e.served is not None]
            if len(loaded) < self.max_loaded:
                return
            victims = [e for e in loaded if e.spec is not None]
            if not victims:
                raise NoRoomError(f"cannot load {entry.id!r}: {len(loaded)} models are loaded (--max-loaded "
                                  f"{self.max_loaded}) and none can be unloaded", param="model")
            # Idle ones first, then the least recently used.
            victim = min(victims, key=lambda e: (e.users + e.wanted > 0, e.last_used))
            log.info("unloading %s to make room for %s (--max-loaded %d)", victim.id, entry.id, self.max_loaded)
            await self._evict(victim)

    async def _evict(self, victim: ModelEntry) -> None:
        """Unload `victim` for a load; if that load is called off while `victim` still serves requests (its
        own waiters left), so is this unload: `victim` stays loaded, and the requests waiting to load it again
        take it as it is (llama-server's queue never stops a busy model for a request that left)."""
        unloading = victim.unloading = asyncio.ensure_future(self._drain_and_close(victim, ModelState.UNLOADED))
        try:
            await asyncio.shield(unloading)
        except asyncio.CancelledError:
            if victim.unloading is unloading and not unloading.done() and (victim.users or victim.wanted):
                victim.spare()
            raise

    async def _unload(self, entry: ModelEntry, state: ModelState) -> None:
        while True:  # again after an eviction that was called off (_evict): this unload is not
            if entry.unloading is None:
                if entry.served is None:
                    return
                entry.unloading = asyncio.ensure_future(self._drain_and_close(entry, state))
            await asyncio.shield(entry.unloading)

    async def _drain_and_close(self, entry: ModelEntry, state: ModelState) -> None:
        try:
            while entry.users or entry.wanted:  # never close a model under a request
                if entry.spared:
                    log.info("%s stays loaded: the load it was to make room for was called off", entry.id)
                    return
                await entry.drained.wait()
            self._idle.cancel(entry)
            served, entry.served = entry.served, None  # out of engines() first: its counters move to the hooks
            assert served is not None
            for hook in self._unload_hooks:
                hook(entry.id, served.llama.engine)
            for sleep_hook in self._sleep_hooks if state is ModelState.SLEEPING else ():
                sleep_hook(entry.id, served)
            # its new state before the close (a thread): a /props during the close reads a sleeping model's
            # kept answer instead of waiting for the close and loading the model again
            entry.state = state
            await asyncio.to_thread(_close, served.llama)
            log.info("unloaded %s (%s)", entry.id, state.value)
        finally:
            entry.unloading = None
            entry.spared = False

    # -- models added and removed while serving (Ollama's /api/pull, /api/copy, /api/delete) ---------------
    def params(self, name: str) -> LlamaParams:
        """The load parameters of the model named `name` (404 if none)."""
        e = self._entry(name)
        if e.spec is not None:
            return e.spec.params
        assert e.served is not None
        return e.served.llama.params

    def expires_in(self, name: str) -> float | None:
        """Seconds until the idle timer of the model named `name` unloads it; None: no timer runs."""
        return self._idle.expires_in(self._entry(name))

    def add(self, spec: ModelSpec) -> None:
        """Serve one more model, loaded when first asked for; a name already served is a 400."""
        for name in (spec.id, *spec.aliases):
            if name in self._names:
                raise ModelExistsError(f"a served model is already named {name!r}", param="model")
        entry = ModelEntry(spec, None)
        self._entries[entry.id] = entry
        for name in (spec.id, *spec.aliases):
            self._names[name] = entry
        if len(self._entries) > 1:
            allocator.map_big_buffers()

    def add_alias(self, name: str, alias: str) -> None:
        """Make `alias` one more name of the model named `name`."""
        entry = self._entry(name)
        if alias in self._names:
            raise ModelExistsError(f"a served model is already named {alias!r}", param="destination")
        entry.aliases = (*entry.aliases, alias)
        self._names[alias] = entry

    async def remove(self, name: str) -> None:
        """Stop serving what `name` names: an alias loses that name; a model is unloaded (once its requests
        are done) and forgotten."""
        entry = self._entry(name)
        name = next(c for c in name_forms(name) if self._names.get(c) is entry)  # the name as it is registered
        if name != entry.id:
            entry.aliases = tuple(a for a in entry.aliases if a != name)
            del self._names[name]
            return
        if entry.spec is None:
            raise ModelPinnedError(f"model {entry.id!r} was given loaded and cannot be removed", param="model")
        if len(self._entries) == 1:
            raise ModelPinnedError(f"model {entry.id!r} is the only one served and cannot be removed",
                                   param="model")
        await self._forget(entry)

    # -- llama-server's --models-preset ----------------------------------------------------------------------
    def _take_presets(self, found: PresetModels) -> None:
        """At the start: the preset file's models, each in the place of a command line model of its id."""
        for spec in found.specs:
            entry = self._entries.get(spec.id)
            if entry is not None and entry.spec is not None:
                self._given[spec.id] = entry.spec
                self._respec(entry, spec)
            else:
                try:
                    self.add(spec)
                except ModelExistsError as exc:  # (an API error: at the start, the preset file's)
                    raise PresetError(f"--models-preset: preset {spec.id!r}: {exc}", field="alias") from None
            self._preset_ids.add(spec.id)
        self.hidden = found.hidden

    async def reload_presets(self) -> None:
        """Read the --models-preset file again (GET /models?reload=1; without one, nothing to read): as
        llama-server's router, a model gone from it is unloaded and forgotten (a command line model it had taken
        the place of comes back), a model whose settings changed is unloaded and served with the new ones, a new
        one is added (not loaded: load-on-startup is for the start only). A file that cannot be served is the
        request's error (PresetError, naming the file and line), the models left as they were."""
        if self._read_presets is None:
            return
        found = await asyncio.to_thread(self._read_presets)
        new = {spec.id: spec for spec in found.specs}
        for ident in sorted(self._preset_ids - set(new)):
            self._preset_ids.discard(ident)
            given = self._given.pop(ident, None)
            if given is not None:
                await self._replace(self._entries[ident], given)
            else:
                await self._forget(self._entries[ident])
        for ident, spec in new.items():
            entry = self._entries.get(ident)
            if entry is None:
                self.add(spec)
            elif entry.spec != spec:
                if ident not in self._preset_ids and entry.spec is not None:
                    self._given[ident] = entry.spec
                await self._replace(entry, spec)
            self._preset_ids.add(ident)
        self.hidden = found.hidden

    async def _replace(self, entry: ModelEntry, spec: ModelSpec) -> None:
        """Serve `entry` with `spec` from its next load on (unloaded first, once its requests are done)."""
        if entry.spec is None:
            raise ModelPinnedError(f"model {entry.id!r} was given loaded and cannot take a preset's settings",
                                   param="model")
        if entry.loading is not None:
            await asyncio.shield(entry.loading)
        await self._unload(entry, ModelState.UNLOADED)
        self._respec(entry, spec)

    def _respec(self, entry: ModelEntry, spec: ModelSpec) -> None:
        for alias in entry.aliases:
            if self._names.get(alias) is entry:
                del self._names[alias]
        entry.spec, entry.aliases = spec, ()
        for alias in spec.aliases:  # as llama-server's reload: an alias another model has is left out, said
            if self._names.get(alias, entry) is not entry:
                log.warning("preset %s: its alias %r is another model's name: left out", spec.id, alias)
                continue
            self._names[alias] = entry
            entry.aliases = (*entry.aliases, alias)

    async def _forget(self, entry: ModelEntry) -> None:
        """Stop serving `entry`: its names and itself forgotten, then unloaded once its requests are done."""
        for alias in (entry.id, *entry.aliases):  # first: no new request finds it
            if self._names.get(alias) is entry:
                del self._names[alias]
        del self._entries[entry.id]
        if entry.loading is not None:
            await asyncio.shield(entry.loading)
        await self._unload(entry, ModelState.UNLOADED)

    # -- work nobody awaits ------------------------------------------------------------------------------
    def _background(self, work: Coroutine[Any, Any, None], what: str = "an idle model's unload") -> None:
        """Run `work` as a task that nobody awaits: kept referenced until it ends, its failure logged."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                log.error("%s failed: %s", what, task.exception())

        task.add_done_callback(done)

    def close(self) -> None:
        """Close every loaded model (at shutdown; from any thread, after the last request)."""
        for entry in self._entries.values():
            self._idle.cancel(entry)
            if entry.served is not None:
                entry.served.llama.close()
                entry.served = None
                entry.state = ModelState.UNLOADED


def _close(llama: Llama) -> None:
    """Close `llama` and give its freed memory back to the system (glibc keeps freed heap pages otherwise)."""
    llama.close()
    allocator.trim()
