"""`llamaplug run` (a completion streamed) and `llamaplug chat` (a conversation in the terminal)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .options import draft_params


def model_path(model: str) -> str | Path:
    """A GGUF path, or "org/repo[:TAG]" (not an existing path): that Hub model, downloaded (or cached)."""
    from ..high import hub

    ref = hub.parse_ref(model)
    if ref is None or model.lower().endswith(".gguf") or Path(model).exists():
        return model
    return hub.download(ref[0], tag=ref[1])


def cmd_run(args: argparse.Namespace) -> int:
    from ..blocks.sampling import SamplerChain
    from ..catalog import default_model
    from ..errors import InvalidParameterError
    from ..high.llama import Llama
    from ..params import LlamaParams, SamplerParams

    if len(args.prompt) > 2 or (len(args.prompt) == 2 and args.model):
        raise InvalidParameterError("`llamaplug run` takes [MODEL] PROMPT (or -m MODEL PROMPT); quote the prompt",
                                    field="prompt")
    model = args.prompt[0] if len(args.prompt) == 2 else args.model
    args.prompt = args.prompt[-1]
    path = model_path(model) if model else default_model(args.catalog)
    extra: dict[str, object] = {"n_threads": args.threads} if args.threads else {}
    if args.devices:
        extra["devices"] = [] if args.devices == ["none"] else args.devices
    llama = Llama.load(LlamaParams(model_path=path, n_ctx=args.ctx_size, log_level=args.log, rpc_servers=args.rpc,
                                   n_gpu_layers=args.n_gpu_layers, **extra, **draft_params(args)))
    sampling = SamplerParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                             penalty_repeat=args.repeat_penalty, seed=args.seed)
    sys.stdout.write(args.prompt)
    final = None
    # closed on the way out, Ctrl-C too: the engine's thread stops before the interpreter does
    with llama, SamplerChain.from_params(sampling) as sampler:
        for chunk in llama.create_completion(args.prompt, max_tokens=args.n_predict, sampler=sampler,
                                             stop=args.stop, stream=True):
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            final = chunk
    sys.stdout.write("\n")
    if final is not None and final.timings is not None and args.timings:
        t = final.timings
        print(f"[{final.stop_reason.value}] prompt {t.prompt_tokens} tokens {t.prompt_per_second:.1f} t/s, "
              f"generated {t.predicted_tokens} tokens {t.predicted_per_second:.1f} t/s"
              + (f", drafted {t.drafted_tokens} accepted {t.accepted_tokens}" if t.drafted_tokens else ""),
              file=sys.stderr)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from ..catalog import default_model
    from ..chat_repl import repl
    from ..high.llama import Llama

    path = model_path(args.model_arg or args.model) if (args.model_arg or args.model) else default_model(args.catalog)
    extra: dict[str, object] = {"n_threads": args.threads} if args.threads else {}
    with Llama.load(path, n_ctx=args.ctx_size, log_level=args.log, n_gpu_layers=args.n_gpu_layers, **extra) as llama:
        sampling = {"temperature": args.temp, "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p,
                    "repeat_penalty": args.repeat_penalty, "seed": args.seed}
        return repl(llama, sampling, None if args.n_predict < 0 else args.n_predict, args.system)
