"""Inputs for segserve.qa.fuzz, all deterministic from a seed: real files, crafted headers, and mutations of both.

An image target (seg, fused) gets JPEG/PNG files and raw tensor bodies; a class-map target (jpeg,
areas) gets class maps (handlers/classmap.py) and upstream error bodies. Every seed is tried once,
in order, before anything random: the extreme sizes among them (a 70000x4 PNG is 1 KB) are then
reached in every run, however short. Pixel content is kept small, because the fused pipeline and the
jpeg node encode their answer at the size the input claims.
"""

import functools
import io
import json
import random
import struct
import zlib
from collections.abc import Callable
from typing import NamedTuple

from handlers import classmap
from segserve.qa.fuzz_worker import ROOT

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # by colour type
PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))  # x0, y0, dx, dy
SIDES = (0, 1, 2, 65500, 65501, 65535, 70000, 2**31 - 1, 2**32 - 1)  # what a header may claim
INTERESTING = (0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 65500, 65501, 25_000_000, 0x7FFFFFFF, 0xFFFFFFFF)
JPEG_SOF = (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF)  # C9-CF: arithmetic coding
FP16 = {"NaN": 0x7E00, "+Inf": 0x7C00, "-Inf": 0xFC00, "denormal": 0x0001, "zero": 0, "-0": 0x8000, "max": 0x7BFF}
# (height, width) a class map claims for the original image: the jpeg node encodes a JPEG of that size.
CLAIMED_SIZES = ((1, 1), (1, 65500), (65500, 1), (1, 65501), (65501, 1), (65535, 1), (1, 65536), (381, 65536), (65536, 381))
CLAIMED_SIZES += ((0, 80), (48, 0), (2**32 - 1, 1), (1, 2**32 - 1), (2**32 - 1, 2**32 - 1), (5000, 5000), (5000, 5001))
UPSTREAM_ERRORS = (b'{"error": "could not decode the png image"}', b'{"error": ', b'{"error": }', b'{"error": "\xff\xfe"}')
UPSTREAM_ERRORS += (b'{"error": 1}', b'{"error": null}', b'{"error": "x"} trailing', b'{"error": {"nested": [1, 2]}}')
# Texts that could reach a status phrase or a header: an upstream node's error message once became the 400's reason
# phrase, and one line break in it killed the worker every time (issue 64). Line breaks netty refuses, what UTF-8
# cannot encode, control and non-ASCII characters, a long text.
HEADER_TEXTS = (
    ("CR", "x\ry"),
    ("LF", "x\ny"),
    ("CRLF header injection", "x\r\nX-Injected: 1"),
    ("NUL", "x\x00y"),
    ("NEL U+0085", "x\x85y"),
    ("LS U+2028", "x\u2028y"),
    ("PS U+2029", "x\u2029y"),
    ("lone surrogate", "x\ud800y"),
    ("ANSI escapes", "\x1b[31mred\x1b[0m\x1b]0;title\x07"),
    ("100 KB", "x" * 100_000 + "\r\n"),
)


class Input(NamedTuple):
    description: str  # how it was made: goes into the report and the corpus .txt
    body: bytes


# PNG -----------------------------------------------------------------------------------------------
def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(rng: random.Random | None, width: int, height: int, colour: int = 2, depth: int = 8, interlace: int = 0) -> bytes:
    """A PNG of any colour type and depth, Adam7 or not; noise from rng with every filter type, or flat without one."""
    raw = bytearray()
    for x0, y0, dx, dy in ADAM7 if interlace else ((0, 0, 1, 1),):
        pass_width, pass_height = -(-(width - x0) // dx), -(-(height - y0) // dy)
        if pass_width <= 0 or pass_height <= 0:
            continue
        row_bytes = -(-pass_width * PNG_CHANNELS[colour] * depth // 8)
        if rng is None:
            raw += bytes(1 + row_bytes) * pass_height
        else:
            for _ in range(pass_height):
                raw += bytes([rng.randrange(5)]) + rng.randbytes(row_bytes)
    chunks = [png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, interlace))]
    if colour == 3:
        chunks.append(png_chunk(b"PLTE", bytes(range(256)) * 3))
    chunks += [png_chunk(b"IDAT", zlib.compress(bytes(raw), 9)), png_chunk(b"IEND", b"")]
    return PNG_SIGNATURE + b"".join(chunks)


def png_chunks(body: bytes) -> list[tuple[int, int]]:
    """(offset, total length) of each whole chunk after the signature."""
    chunks, pos = [], len(PNG_SIGNATURE)
    while pos + 12 <= len(body):
        size = 12 + struct.unpack_from(">I", body, pos)[0]
        if pos + size > len(body):
            break
        chunks.append((pos, size))
        pos += size
    return chunks


def fix_png_crcs(body: bytearray) -> None:
    """Recompute every whole chunk's CRC, so a mutation reaches the decoder instead of its CRC check."""
    for pos, size in png_chunks(body):
        struct.pack_into(">I", body, pos + size - 4, zlib.crc32(body[pos + 4 : pos + size - 4]))


def jpeg_markers(body: bytes) -> list[int]:
    """Offsets of the markers from SOI to SOS (the headers before the entropy-coded data)."""
    offsets, pos = [0], 2
    while pos + 4 <= len(body) and body[pos] == 0xFF:
        offsets.append(pos)
        if body[pos + 1] == 0xDA:
            break
        pos += 2 + struct.unpack_from(">H", body, pos + 2)[0]
    return offsets


# Seeds ---------------------------------------------------------------------------------------------
def pil_bytes(image, format: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format, **options)
    return buffer.getvalue()


@functools.cache  # seg and fused share them
def image_seeds() -> tuple[Input, ...]:
    """Real JPEG/PNG files of every kind the decoders take, then extreme sizes in few bytes."""
    from PIL import Image
    from torchvision.io import encode_jpeg, encode_png

    from segserve.model.synthetic import make_sample

    seeds = [Input(f"sample {path.name}", path.read_bytes()) for path in sorted((ROOT / "samples").glob("*.jpg"))]
    pixels = make_sample(7, 40, 72)[0]
    image, baseline = Image.fromarray(pixels.permute(1, 2, 0).numpy()), encode_jpeg(pixels, quality=90).numpy().tobytes()
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90°
    seeds += [
        Input("jpeg 72x40 (torchvision)", baseline),
        Input("png 72x40 rgb (torchvision)", encode_png(pixels).numpy().tobytes()),
        Input("jpeg 72x40 progressive", pil_bytes(image, "JPEG", progressive=True)),
        Input("jpeg 72x40 optimised huffman, 4:4:4", pil_bytes(image, "JPEG", optimize=True, subsampling=0)),
        Input("jpeg 72x40 quality 1", pil_bytes(image, "JPEG", quality=1)),
        Input("jpeg 72x40 greyscale", pil_bytes(image.convert("L"), "JPEG")),
        Input("jpeg 72x40 cmyk", pil_bytes(image.convert("CMYK"), "JPEG")),
        Input("jpeg 72x40 exif orientation 6", pil_bytes(image, "JPEG", exif=exif.tobytes())),
        Input("jpeg 1x1", pil_bytes(image.resize((1, 1)), "JPEG")),
        Input("jpeg 65500x1", pil_bytes(Image.new("RGB", (65500, 1)), "JPEG")),
        Input("apng 72x40, 3 frames", pil_bytes(image, "PNG", save_all=True, append_images=[image.rotate(90), image.convert("L")])),
    ]
    rng = random.Random(0)
    for colour, depths in PNG_DEPTHS.items():
        for depth in depths:
            for interlace in (0, 1):
                kind = "adam7" if interlace else "plain"
                seeds.append(Input(f"png 13x7 colour {colour} depth {depth} {kind}", png(rng, 13, 7, colour, depth, interlace)))
    palette = png(rng, 13, 7, 3, 2)
    seeds += [Input(f"png 13x7 palette truncated at byte {cut}", palette[:cut]) for cut, _ in png_chunks(palette)]
    seeds += [Input(f"jpeg 72x40 truncated at byte {cut}", baseline[:cut]) for cut in jpeg_markers(baseline) + [len(baseline) - 2]]
    # A few bytes that claim a big side: the JPEG encoder's limit is 65500 px a side; a tall image resizes slowly.
    for width, height, colour, depth in ((70000, 4, 2, 8), (65500, 1, 2, 8), (65501, 1, 2, 8), (1, 65501, 0, 1), (4, 70000, 2, 8)):
        seeds.append(Input(f"png {width}x{height} colour {colour} depth {depth} flat", png(None, width, height, colour, depth)))
    for width, height in ((1_000_000, 1), (1, 1_000_000), (4_000_000, 1), (1, 4_000_000)):  # libpng's own limit: 1,000,000
        seeds.append(Input(f"png {width}x{height} grey depth 1 flat", png(None, width, height, 0, 1)))
    return tuple(seeds)


RAW_KINDS = ("normal", "sprinkled", "noise", *FP16)


def raw_body(rng: random.Random, nbytes: int, kind: str = "") -> Input:
    """A raw FP16 tensor body of the exact size: normal values, one special value throughout, a sprinkle, or noise."""
    kind = kind or rng.choice(RAW_KINDS)
    if kind in FP16:
        return Input(f"raw fp16, all {kind}", struct.pack("<H", FP16[kind]) * (nbytes // 2))
    if kind == "noise":
        return Input("raw fp16, random bytes", rng.randbytes(nbytes))
    import torch

    values = torch.randn(nbytes // 2, generator=torch.Generator().manual_seed(rng.randrange(2**32))).half()
    body = bytearray(values.numpy().tobytes())
    if kind == "normal":
        return Input("raw fp16, normal(0, 1)", bytes(body))
    special = rng.choice(["NaN", "+Inf", "-Inf"])
    for _ in range(rng.randint(1, 8)):
        struct.pack_into("<H", body, 2 * rng.randrange(nbytes // 2), FP16[special])
    return Input(f"raw fp16, normal(0, 1) with a few {special}", bytes(body))


def classmap_body(rng: random.Random, height: int, width: int, classes: int, original: tuple[int, int]) -> bytes:
    labels = rng.randbytes(height * width).translate(bytes(i % max(classes, 1) for i in range(256)))
    return classmap.HEADER.pack(classmap.MAGIC, classmap.VERSION, classes, height, width, *original) + labels


def classmap_seeds() -> list[Input]:
    rng = random.Random(0)
    seeds = [Input(f"class map 64x112, original {h}x{w}", classmap_body(rng, 64, 112, 2, (h, w))) for h, w in CLAIMED_SIZES]
    seeds += [Input(f"class map {h}x{w}, original {h}x{w}", classmap_body(rng, h, w, 2, (h, w))) for h, w in ((1, 1), (3, 500), (64, 112))]
    seeds += [Input("class map 8x8 with 255 classes", classmap_body(rng, 8, 8, 255, (48, 80)))]
    return seeds + [Input(f"upstream error {body[:24]!r}", body) for body in UPSTREAM_ERRORS] + header_text_errors()


def header_text_errors() -> list[Input]:
    """Upstream error bodies ({"error": ...}, as a refusing node's answer reaches the jpeg and areas nodes) carrying
    each of HEADER_TEXTS: JSON-escaped, and raw where JSON allows it (U+0085, U+2028/2029 as UTF-8; the lone
    surrogate then makes bytes that are not UTF-8); an error that is an object; raw bytes that are not UTF-8."""
    items = []
    for name, text in HEADER_TEXTS:
        escaped = json.dumps({"error": text}).encode()
        raw = json.dumps({"error": text}, ensure_ascii=False).encode("utf-8", "surrogatepass")
        items.append(Input(f"upstream error with {name}", escaped))
        if raw != escaped:
            items.append(Input(f"upstream error with {name}, unescaped", raw))
    items.append(Input("upstream error that is an object holding CRLF", json.dumps({"error": {"message": "x\r\nX-Injected: 1"}}).encode()))
    items.append(Input("upstream error of bytes that are not UTF-8", b'{"error": "x\xc3\x28\xff\xfe\r\nX-Injected: 1"}'))
    return items


# Crafted headers -----------------------------------------------------------------------------------
def craft_png(rng: random.Random, bases: list[Input]) -> Input:
    """A real PNG with its IHDR fields edited (CRC fixed, mostly), chunks removed/duplicated, or truncated."""
    base = rng.choice(bases)
    body, chunks = bytearray(base.body), png_chunks(base.body)
    action = rng.choice(("ihdr", "ihdr", "ihdr", "truncate", "remove", "duplicate", "unknown critical chunk", "split idat"))
    if action == "ihdr":
        field, offset, size = rng.choice((("width", 16, 4), ("height", 20, 4), ("depth", 24, 1), ("colour", 25, 1), ("interlace", 28, 1)))
        value = rng.choice(SIDES) if size == 4 else rng.choice((0, 1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 255))
        body[offset : offset + size] = value.to_bytes(size, "big")
        action = f"IHDR {field}={value}"
    elif action == "truncate":
        cut = rng.choice([pos for pos, _ in chunks] + [rng.randrange(len(body))])
        return Input(f"{base.description} | truncated at byte {cut}", bytes(body[:cut]))
    else:
        pos, size = rng.choice(chunks)
        kind = bytes(body[pos + 4 : pos + 8]).decode()
        if action == "remove":
            del body[pos : pos + size]
        elif action == "duplicate":
            body[pos:pos] = body[pos : pos + size]
        elif action == "unknown critical chunk":
            body[pos:pos] = png_chunk(b"XyZw", b"\0" * 4)
        else:  # every IDAT byte in a chunk of its own
            idat = [p for p, _ in chunks if body[p + 4 : p + 8] == b"IDAT"][0]
            data = body[idat + 8 : idat + 8 + struct.unpack_from(">I", body, idat)[0]]
            body[idat : idat + 12 + len(data)] = b"".join(png_chunk(b"IDAT", data[i : i + 1]) for i in range(len(data)))
        action = f"{action} ({kind} at byte {pos})" if action != "split idat" else action
    if rng.random() < 0.9:
        fix_png_crcs(body)
    return Input(f"{base.description} | {action}", bytes(body))


JPEG_FRAME_EDITS = ("marker", "height", "width", "components", "precision", "sampling", "quant table", "truncate")


def craft_jpeg(rng: random.Random, bases: list[Input]) -> Input:
    """A real JPEG with its frame header edited: SOF type (arithmetic C9/CA …), size, components, precision, sampling."""
    base = rng.choice(bases)
    body = bytearray(base.body)
    sof = next(i for i in range(2, len(body) - 9) if body[i] == 0xFF and body[i + 1] in JPEG_SOF)
    edits = []
    fields = [rng.choice(JPEG_FRAME_EDITS) for _ in range(rng.randint(1, 3))]
    for field in sorted(fields, key=lambda f: f == "truncate"):  # truncation last: later edits index the frame header
        if field == "marker":
            body[sof + 1] = value = rng.choice(JPEG_SOF)
            edits.append(f"SOF marker {value:02X}")
        elif field in ("height", "width"):
            value = rng.choice((0, 1, 2, 16, 65500, 65501, 65535, rng.randrange(65536)))
            struct.pack_into(">H", body, sof + (5 if field == "height" else 7), value)
            edits.append(f"{field} {value}")
        elif field == "truncate":
            cut = rng.randrange(sof, len(body))
            body = body[:cut]
            edits.append(f"truncated at byte {cut}")
        else:
            offset, values = {
                "components": (9, (0, 1, 2, 4, 5, 255)),
                "precision": (4, (0, 1, 12, 16, 255)),
                "sampling": (11, (0x00, 0x11, 0x22, 0x44, 0x41, 0x14, 0xFF)),
                "quant table": (12, (1, 3, 4, 255)),
            }[field]
            if sof + offset < len(body):
                body[sof + offset] = value = rng.choice(values)
                edits.append(f"{field} {value:#x}")
    return Input(f"{base.description} | " + ", ".join(edits), bytes(body))


def craft_classmap(rng: random.Random) -> Input:
    """A class map with a claimed original size (extreme or small) and, sometimes, a broken header field."""
    height, width = rng.choice(((1, 1), (8, 8), (3, 500), (500, 3), (64, 112), (256, 448)))
    classes = rng.choice((0, 1, 2, 2, 2, 3, 255))
    original = rng.choice(CLAIMED_SIZES) if rng.random() < 0.3 else (rng.randint(1, 600), rng.randint(1, 600))
    body = bytearray(classmap_body(rng, height, width, classes, original))
    description = f"class map {height}x{width}, {classes} classes, original {original[0]}x{original[1]}"
    if rng.random() < 0.3:
        field, offset, fmt = rng.choice((("magic", 0, "<I"), ("version", 4, "<B"), ("height", 6, "<H"), ("width", 8, "<H")))
        value = rng.choice(INTERESTING) & {"<I": 0xFFFFFFFF, "<B": 0xFF, "<H": 0xFFFF}[fmt]
        struct.pack_into(fmt, body, offset, value)
        description += f" | header {field}={value}"
    return Input(description, bytes(body))


# Mutations -----------------------------------------------------------------------------------------
def offset(rng: random.Random, body: bytearray) -> int:
    """Half the time within the first 512 bytes, where the headers are."""
    return rng.randrange(min(len(body), 512) if rng.random() < 0.5 else len(body)) if body else 0


def flip_bits(rng, body, other):
    spots = [offset(rng, body) for _ in range(rng.randint(1, 8))] if body else []
    for spot in spots:
        body[spot] ^= 1 << rng.randrange(8)
    return f"{len(spots)} bits flipped"


def set_int(rng, body, other):
    at, size, order = offset(rng, body), rng.choice((1, 2, 4)), rng.choice(("big", "little"))
    value = rng.choice(INTERESTING) & (256**size - 1)
    body[at : at + size] = value.to_bytes(size, order)
    return f"{size}-byte {order}-endian {value} at byte {at}"


def truncate(rng, body, other):
    cut = offset(rng, body)
    del body[cut:]
    return f"truncated at byte {cut}"


def delete(rng, body, other):
    at, size = offset(rng, body), rng.randint(1, 64)
    del body[at : at + size]
    return f"{size} bytes deleted at byte {at}"


def duplicate(rng, body, other):
    at, size = offset(rng, body), rng.randint(1, 256)
    body[at:at] = body[at : at + size]
    return f"{size} bytes duplicated at byte {at}"


def splice(rng, body, other):
    at, tail = offset(rng, body), rng.randrange(len(other) + 1)
    body[at:] = other[tail:]
    return f"spliced at byte {at} with another seed from byte {tail}"


MUTATIONS = (flip_bits, flip_bits, set_int, set_int, truncate, delete, duplicate, splice)


def mutate(rng: random.Random, item: Input, other: Input) -> Input:
    body, steps = bytearray(item.body), []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        steps.append(rng.choice(MUTATIONS)(rng, body, other.body))
    if body.startswith(PNG_SIGNATURE) and rng.random() < 0.5:
        fix_png_crcs(body)
        steps.append("CRCs fixed")
    return Input(f"{item.description} | " + ", ".join(steps), bytes(body))


# Per target ----------------------------------------------------------------------------------------
class InputSource:
    """The inputs of one target: every seed once (extra_seeds, the corpus, first), then crafted headers and
    mutated seeds, from random.Random(seed)."""

    def __init__(self, target: str, seed: int, raw_nbytes: int, extra_seeds: list[Input] = ()):
        self.rng = random.Random(f"{seed}/{target}")
        if target in ("seg", "fused"):
            self.seeds = [*image_seeds()] + [raw_body(random.Random(0), raw_nbytes, kind) for kind in RAW_KINDS]
            whole = [s for s in self.seeds if "truncated" not in s.description]
            jpegs = [s for s in whole if s.description.startswith("jpeg 72x40")]
            pngs = [s for s in whole if s.description.startswith("png 13x7")]
            self.crafters: list[Callable] = [
                lambda r: craft_jpeg(r, jpegs),
                lambda r: craft_png(r, pngs),
                lambda r: raw_body(r, raw_nbytes),
            ]
        elif target in ("jpeg", "areas"):
            self.seeds, self.crafters = classmap_seeds(), [craft_classmap]
        else:  # the harness's self-test target
            self.seeds, self.crafters = [Input("ok", b"ok")], [lambda r: Input("ok", b"ok")]
        self.seeds = [*extra_seeds, *self.seeds]  # saved findings first: a regression shows at once
        self.count = 0

    def __next__(self) -> Input:
        self.count += 1
        if self.count <= len(self.seeds):
            return self.seeds[self.count - 1]
        rng = self.rng
        if rng.random() < 0.3:
            return rng.choice(self.crafters)(rng)
        base = rng.choice(self.seeds) if rng.random() < 0.7 else rng.choice(self.crafters)(rng)
        if len(base.body) > 200_000 and rng.random() < 0.8:  # mostly mutate small inputs: they are quick to answer and to keep
            base = rng.choice(self.crafters)(rng)
        return mutate(rng, base, rng.choice(self.seeds))


def good_input(target: str) -> bytes:
    """A known-valid body for the target: the fuzzed row's batch-mates, which must always get 200."""
    if target in ("seg", "fused"):
        from torchvision.io import encode_png

        from segserve.model.synthetic import make_sample

        return encode_png(make_sample(3, 48, 80)[0]).numpy().tobytes()
    if target in ("jpeg", "areas"):
        return classmap_body(random.Random(3), 256, 448, 2, (48, 80))
    return b"ok"
