"""llama.cpp's BPE pre-tokenizers: `tokenizer.ggml.pre` name -> the regexes llama-vocab.cpp splits with.

Transcribed from llm_tokenizer_bpe of the pinned llama.cpp (src/llama-vocab.cpp): the regexes are
llama.cpp's own adapted ones (not the upstream tokenizer.json ones), applied one after the other,
each keeping the text between matches as pieces too (HF `Split(..., "isolated")`).
"""

from __future__ import annotations

import dataclasses

_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (_CONTRACTIONS
          + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",)
QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",)
QWEN35 = (_CONTRACTIONS
          + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",)
GPT2 = (_GPT2,)
STARCODER = (r"\p{N}", _GPT2)
FALCON = (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]")
DEEPSEEK_LLM = (
    '[\r\n]',
    '\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+',
    '\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+',
    '\\s+$',
    '[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+',
    '\\p{N}+',
)
DEEPSEEK_CODER = (
    '[\r\n]',
    '\\s?\\p{L}+',
    '\\s?\\p{P}+',
    '[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+',
    '\\p{N}',
)
DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]")
BLOOM = (
    ' ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+',
)
VIKING = (
    ' ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+',
    '\\p{N}',
)
SEED_CODER = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",)
LINES = ("[^\\n]+|[\\n]+",)


@dataclasses.dataclass(frozen=True)
class Pre:
    """How llama.cpp pre-tokenizes one `tokenizer.ggml.pre`."""

    regexes: tuple[str, ...]
    ignore_merges: bool = False
    byte_encode: bool = True  # GPT-2 byte-level pieces; False: raw UTF-8 with <0xXX> byte tokens
    escape_whitespace: bool = False  # spaces become U+2581 first (SPM-style BPE)
    tested: bool = False  # compared token for token with llama.cpp by the test suite


def _names(pre: Pre, *names: str) -> dict[str, Pre]:
    return dict.fromkeys(names, pre)


PRE_TYPES: dict[str, Pre] = {
    **_names(Pre(LLAMA3, ignore_merges=True, tested=True), "llama-bpe"),
    **_names(Pre(LLAMA3, ignore_merges=True), "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
             "lfm2", "jina-v5-nano", "glm4", "glm5"),
    **_names(Pre(LLAMA3), "dbrx", "smaug-bpe", "chatglm-bpe"),
    **_names(Pre(DEEPSEEK_LLM, tested=True), "deepseek-llm"),
    **_names(Pre(DEEPSEEK_CODER, tested=True), "deepseek-coder"),
    **_names(Pre(FALCON, tested=True), "falcon"),
    **_names(Pre(GPT2, tested=True), "gpt-2", "mpt"),
    **_names(Pre(GPT2), "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
             "modern-bert", "exaone4", "olmo", "jais", "trillion", "granite-docling", "jina-v1-en", "jina-v2-code",
             "roberta-bpe"),
    **_names(Pre(STARCODER, tested=True), "starcoder", "refact", "command-r", "smollm"),
    **_names(Pre(STARCODER), "codeshell", "exaone", "minerva-7b", "mellum2"),
    **_names(Pre(QWEN2, tested=True), "qwen2"),
    **_names(Pre(QWEN2), "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"),
    **_names(Pre(QWEN35, tested=True), "qwen35"),
    **_names(Pre(BLOOM), "poro-chat", "bloom", "gpt3-finnish"),
    **_names(Pre(VIKING), "viking"),
    **_names(Pre(SEED_CODER), "seed-coder"),
    **_names(Pre(DEFAULT), "default", ""),
    **_names(Pre(LINES, byte_encode=False, escape_whitespace=True, tested=True), "gemma4"),
    **_names(Pre(LINES, byte_encode=False, escape_whitespace=True), "granite-embed-multi-311m", "sarvam-moe"),
}

# Pre-tokenizers llama.cpp implements with code of its own (not a regex), or that add tokens its BPE
# export here cannot express: exporting one is an UnsupportedVocabError naming it.
REFUSED = {
    "kimi-k2": "llama.cpp splits Han text with custom code (unicode.cpp), not a regex",
    "afmoe": "llama.cpp groups digits with custom code (\\p{AFMoE_digits})",
    "whitespace": "llama.cpp uses its own whitespace session",
}
