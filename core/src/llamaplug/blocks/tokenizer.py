"""External tokenizers (ModelParams.tokenizer): found through the llamaplug_register_tokenizers hook."""

from __future__ import annotations

from typing import Any

from ..errors import TokenizerError
from ..plugins import tokenizer_factories

# Tokenizer plugins the project ships, for the message when one is asked for but not installed.
KNOWN = {"hf": "llamaplug-tokenizer-hf"}


def attach(spec: Any, model: Any) -> Any:
    """The tokenizer `spec` names ("name:source" or an object), loaded and checked against `model`."""
    factories = tokenizer_factories()
    if isinstance(spec, str):
        name, _, source = spec.partition(":")
        found = factories.get(name)
        if found is None:
            package = KNOWN.get(name)
            hint = f"install {package} (pip install {package})" if package else \
                f"no installed plugin registers it (registered: {', '.join(sorted(factories)) or 'none'})"
            raise TokenizerError(f'tokenizer="{spec}" for {model.path.name} needs the {name!r} tokenizer plugin: '
                                 f"{hint}")
        return found.factory(source, model)
    for found in factories.values():
        attached = found.factory(spec, model)
        if attached is not None:
            return attached
    kind = f"{type(spec).__module__}.{type(spec).__qualname__}"
    hint = " (install llamaplug-tokenizer-hf)" if kind.startswith("tokenizers.") else ""
    raise TokenizerError(f"no tokenizer plugin takes a {kind} for {model.path.name}{hint}")
