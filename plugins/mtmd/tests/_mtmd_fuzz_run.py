"""Fuzz the bitmap decoders (stb_image, miniaudio through mtmd-helper) with corrupted files.

Run by test_mtmd_fuzz.py in a child interpreter, so that a crash is a failed test, not a dead
pytest: `PYTHONPATH=tests python _mtmd_fuzz_run.py TEXT MMPROJ AUDIO_MMPROJ JPEG CASES SEED`
(tests/ for the seed files' builders, tests/fixtures). Each case is one
mutation of a valid seed file (PNG, BMP, JPEG through the vision projector, WAV, MP3 through the
audio one); it must give a bitmap (which is then tokenised, i.e. preprocessed by the projector:
resized / turned into mel spectrograms) or a LlamaError subclass. Prints each case before
running it (the last line names the culprit of a crash) and a JSON summary at the end.
"""

from __future__ import annotations

import json
import random
import struct
import sys
import zlib
from collections import Counter
from pathlib import Path

from fixtures.tiny_mmproj import bmp_bytes, png_bytes, sample_image, sample_tone, wav_bytes
from llamaplug_mtmd import DEFAULT_MARKER, MtmdBitmap, MtmdContext, MtmdParams

import llamaplug as lp

MAX_PIXELS = 4_000_000  # successful decodes larger than this are not preprocessed (time, not safety)
BOUNDARY = [0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF]


def png_with_ihdr(width: int, height: int, depth: int = 8, color: int = 2, fix_crc: bool = True) -> bytes:
    base = png_bytes(sample_image(8, 8))
    header = struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, 0)
    crc = zlib.crc32(b"IHDR" + header) & 0xFFFFFFFF if fix_crc else 0
    return base[:16] + header + struct.pack(">I", crc) + base[33:]


def mutate(rng: random.Random, data: bytes, fmt: str) -> tuple[str, bytes]:
    buf = bytearray(data)
    kind = rng.choice(["flip", "bytes", "boundary", "truncate", "insert", "delete", "splice", "header", "repeat"])
    n = len(buf)
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(n)
            buf[i] ^= 1 << rng.randrange(8)
    elif kind == "bytes":
        for _ in range(rng.randint(1, 16)):
            buf[rng.randrange(n)] = rng.randrange(256)
    elif kind == "boundary":
        head = min(n, 64)
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(head)] = rng.choice(BOUNDARY)
    elif kind == "truncate":
        buf = buf[: rng.randrange(n)]
    elif kind == "insert":
        i = rng.randrange(n)
        buf[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    elif kind == "delete":
        i = rng.randrange(n)
        del buf[i:i + rng.randint(1, 64)]
    elif kind == "splice":
        i, j = sorted(rng.randrange(n) for _ in range(2))
        buf = buf[:i] + buf[j:] + buf[i:j]
    elif kind == "repeat":
        i = rng.randrange(n)
        buf = buf[:i] + buf[i:i + rng.randint(1, 256)] * rng.randint(2, 20) + buf[i:]
    else:  # format-aware header fields: sizes, dimensions, chunk lengths
        if fmt == "png":
            w, h = rng.choice([(0, 1), (1, 0), (1, 1), (1, 65535), (65535, 1), (0x7FFFFFFF, 2), (16384, 16384),
                               (rng.randrange(1, 5000), rng.randrange(1, 5000))])
            depth, color = rng.choice([(8, 2), (16, 2), (1, 0), (4, 3), (8, 6), (3, 2), (8, 7)])
            return f"png-ihdr {w}x{h} d{depth} c{color}", png_with_ihdr(w, h, depth, color, rng.random() < 0.8)
        if fmt == "bmp":
            offset = rng.choice([2, 10, 14, 18, 22, 28, 30, 34])
            value = rng.choice([0, 1, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, -1 & 0xFFFFFFFF, rng.randrange(1 << 32)])
            buf[offset:offset + 4] = struct.pack("<I", value)[: len(buf[offset:offset + 4])]
        elif fmt == "wav":
            offset = rng.choice([4, 16, 20, 22, 24, 28, 32, 34, 40])
            buf[offset:offset + 4] = struct.pack("<I", rng.choice([0, 1, 0xFFFF, 0xFFFFFFFF, rng.randrange(1 << 32)]))
        elif fmt == "jpeg":
            sof = data.find(b"\xff\xc0")
            if sof > 0:
                h, w = rng.choice([(0, 1), (1, 0), (65535, 65535), (1, 65535), (rng.randrange(65536), 8)])
                buf[sof + 5:sof + 9] = struct.pack(">HH", h, w)
        else:
            buf[: 4] = bytes(rng.randrange(256) for _ in range(4))
    return kind, bytes(buf)


def main() -> int:
    text_path, mmproj_path, audio_mmproj_path, jpeg_path = sys.argv[1:5]
    cases, seed = int(sys.argv[5]), int(sys.argv[6])
    rng = random.Random(seed)
    seeds = {"png": png_bytes(sample_image(24, 40)), "png-small": png_bytes(sample_image(3, 5, seed=9)),
             "bmp": bmp_bytes(sample_image(9, 13)), "wav": wav_bytes(sample_tone(0.05))}
    if Path(jpeg_path).is_file():
        seeds["jpeg"] = Path(jpeg_path).read_bytes()
        mp3 = Path(jpeg_path).with_name("test-2.mp3")
        if mp3.is_file():
            seeds["mp3"] = mp3.read_bytes()[:8192]
    lp.LlamaBackend.init()
    model = lp.LlamaModel(text_path, lp.ModelParams())
    vision = MtmdContext(mmproj_path, model, MtmdParams(n_threads=2, warmup=False))
    audio = MtmdContext(audio_mmproj_path, model, MtmdParams(n_threads=2, warmup=False))
    outcomes: Counter[str] = Counter()
    unexpected: list[str] = []
    formats = sorted(seeds)
    for case in range(cases):
        fmt = formats[case % len(formats)]
        kind, data = mutate(rng, seeds[fmt], fmt.split("-")[0])
        print(f"case {case} {fmt} {kind} {len(data)} bytes", flush=True)
        mtmd = audio if fmt in ("wav", "mp3") else vision
        try:
            bitmap = MtmdBitmap.from_bytes(data, mtmd)
        except lp.LlamaError as exc:
            outcomes[f"{fmt}: {type(exc).__name__}"] += 1
            continue
        except Exception as exc:  # noqa: BLE001 - anything but a LlamaError is a finding
            unexpected.append(f"case {case} {fmt} {kind}: {type(exc).__name__}: {exc}")
            continue
        # audio is preprocessed (mel spectrograms of 30 s windows) for one decoded clip in four: time, not safety
        audio_skip = bitmap.is_audio and (outcomes[f"{fmt}: decoded"] + outcomes[f"{fmt}: decoded+tokenized"]) % 4
        if audio_skip or (not bitmap.is_audio and bitmap.nx * bitmap.ny > MAX_PIXELS):
            outcomes[f"{fmt}: decoded"] += 1
            bitmap.close()
            continue
        try:
            chunks = mtmd.tokenize(DEFAULT_MARKER, [bitmap], add_special=False)
            outcomes[f"{fmt}: decoded+tokenized"] += 1
            chunks.close()
        except lp.LlamaError as exc:
            outcomes[f"{fmt}: decoded, {type(exc).__name__}"] += 1
        except Exception as exc:  # noqa: BLE001
            unexpected.append(f"case {case} {fmt} {kind} ({bitmap.nx}x{bitmap.ny}): {type(exc).__name__}: {exc}")
        bitmap.close()
    model.close()
    print(json.dumps({"cases": cases, "outcomes": dict(sorted(outcomes.items())), "unexpected": unexpected}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
