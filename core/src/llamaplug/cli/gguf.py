"""The GGUF file commands: `llamaplug inspect` (what a file holds) and `llamaplug quantize`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..blocks.gguf_info import GgufInfo


INSPECT_JSON = """--json prints one JSON document:
  file: {path, size, version, alignment, data_offset, n_kv, n_tensors}
  metadata: {KEY: {type, value}}; an array: {type: "array", element_type, count,
             values: the first 16 (all with --all; null past 4M items)}
  tensors: [{name, type, shape (ggml order, ne[0] first), offset (in the file), n_elements, n_bytes}]
  totals: {n_tensors, n_parameters, n_bytes, by_type: {TYPE: {tensors, parameters, bytes}}}
  vocabulary: {model, pre, n_tokens, n_merges, special: {NAME: {id, text}}, flags: {NAME: bool},
               token_types: {TYPE: count}}, or null
  chat_templates: {"default" (tokenizer.chat_template) or NAME (tokenizer.chat_template.NAME): template}"""


def _file_or_catalog(model: str) -> str | Path:
    """The file `model` names: a path, a catalog model's name (`llamaplug info` lists them) or a cached
    org/repo[:TAG] (high/names.py, as every command reads a model's name; nothing is downloaded)."""
    from ..high import names

    return names.resolve(model, download=False)


def cmd_inspect(args: argparse.Namespace) -> int:
    from ..blocks.gguf_info import ARRAY_HEAD, read_gguf_info

    info = read_gguf_info(_file_or_catalog(args.model))
    if args.json:
        json.dump(info.to_json(array_items=None if args.all else ARRAY_HEAD), sys.stdout, ensure_ascii=False,
                  indent=2)
        sys.stdout.write("\n")
        return 0
    for line in _inspect_report(info, None if args.all else args.tensors):
        print(line)
    return 0


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _short(value: object, width: int = 72) -> str:
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
    elif isinstance(value, float):
        text = f"{value:.8g}"  # float32 values: no digits past their precision
    else:
        text = str(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def _model_summary(info: GgufInfo) -> list[str]:
    """The architecture and the quantization by name (general.file_type is only a number)."""
    arch = info.metadata.get("general.architecture")
    ftype = info.metadata.get("general.file_type")
    parts = [f"architecture {arch.value}"] if arch is not None else []
    if ftype is not None and isinstance(ftype.value, int):
        from ..blocks.quantize import ftype_name

        parts.append(f"quantization {ftype_name(ftype.value)} (general.file_type {ftype.value})")
    return [f"  {', '.join(parts)}"] if parts else []


def _inspect_report(info: GgufInfo, max_tensors: int | None) -> list[str]:
    templates = info.chat_templates()
    lines = [f"file: {info.path}",
             f"  {info.size:,} bytes ({_mib(info.size)}), GGUF v{info.version}, {len(info.metadata)} keys, "
             f"{len(info.tensors)} tensors, alignment {info.alignment}, tensor data at byte {info.data_offset:,}",
             *_model_summary(info), "", f"metadata ({len(info.metadata)} keys):"]
    width = max((len(k) for k in info.metadata), default=0)
    for key, value in info.metadata.items():
        if value.type == "array":
            shown = "(not read)" if value.value is None else ", ".join(_short(v, 24) for v in value.value[:8])
            more = ", ..." if value.count > 8 and value.value is not None else ""
            text = f"[{value.element_type} x {value.count}] {shown}{more}"
        elif key == "tokenizer.chat_template" or key.startswith("tokenizer.chat_template."):
            text = f"string, {len(value.value)} characters (chat template, below)"
        else:
            text = _short(value.value)
        lines.append(f"  {key:{width}}  {text}")
    lines += ["", f"tensors ({len(info.tensors)}, {info.n_parameters:,} parameters, {info.n_bytes:,} bytes):"]
    shown_tensors = info.tensors if max_tensors is None else info.tensors[:max_tensors]
    width = max((len(t.name) for t in shown_tensors), default=4)
    lines.append(f"  {'name':{width}}  {'type':7}  {'shape':20}  {'bytes':>12}")
    for t in shown_tensors:
        shape = " x ".join(str(d) for d in t.shape)
        lines.append(f"  {t.name:{width}}  {t.type:7}  {shape:20}  {t.n_bytes:>12,}")
    if len(shown_tensors) < len(info.tensors):
        lines.append(f"  ... {len(info.tensors) - len(shown_tensors)} more (--tensors N or --all)")
    lines.append("  by type:")
    for name, total in info.by_type().items():
        lines.append(f"    {name:7}  {total.tensors:5} tensors  {total.parameters:>14,} parameters  "
                     f"{total.bytes:>14,} bytes")
    vocab = info.vocabulary()
    lines += ["", "vocabulary:"]
    if vocab is None:
        lines.append("  none (no tokenizer.ggml.tokens)")
    else:
        merges = f", {vocab.n_merges:,} merges" if vocab.n_merges is not None else ""
        lines.append(f"  model {vocab.model}, pre {vocab.pre}, {vocab.n_tokens:,} tokens{merges}")
        if vocab.special:
            lines.append("  special: " + ", ".join(f"{name} {tok.id} {_short(tok.text, 32)}"
                                                   for name, tok in vocab.special.items()))
        if vocab.flags:
            lines.append("  flags: " + ", ".join(f"{name} {value}" for name, value in vocab.flags.items()))
        if vocab.token_types:
            lines.append("  token types: " + ", ".join(f"{name} {n:,}" for name, n in vocab.token_types.items()))
    if not templates:
        lines += ["", "chat template: none"]
    for name, template in templates.items():
        lines += ["", f"chat template ({name}, {len(template)} characters):", template]
    return lines


def cmd_quantize(args: argparse.Namespace) -> int:
    from ..blocks.quantize import quantize

    out = quantize(args.src, args.dst, args.type, imatrix=args.imatrix, threads=args.threads,
                   allow_requantize=args.allow_requantize, leave_output_tensor=args.leave_output_tensor,
                   pure=args.pure, quiet=args.quiet)
    if not args.quiet:
        print(f"wrote {out} ({_mib(out.stat().st_size)})", file=sys.stderr)
    return 0
