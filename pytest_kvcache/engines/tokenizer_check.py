"""The tokenizer of a GGUF converted for vLLM, checked against the GGUF's own (llama.cpp's) before it is used.

vLLM serves whatever tokenizer a model folder holds, and a wrong one (transformers 5.17 turned Gemma-3's
SentencePiece vocabulary into a BPE without merges: one token per character) gives a model that answers
nonsense without an error. So every conversion tokenizes a fixed multilingual sample
(``pytest_kvcache/data/tokenizer/sample.txt``: English, German, French, Russian, Greek, Chinese, Japanese,
Korean, Arabic, Hindi, emoji, code with indentation and tabs, digits, runs of spaces, blank lines) twice:

- with the converted folder's tokenizer, loaded back with ``AutoTokenizer.from_pretrained(folder)`` (what
  vLLM loads), ``encode(text)`` with its special tokens (``add_special_tokens=True``, vLLM's default for a
  completion prompt);
- with llama.cpp's ``llama-tokenize`` (tools/tokenize, which loads the GGUF's vocabulary only, no weights),
  with its special tokens: it adds BOS when the GGUF's ``tokenizer.ggml.add_bos_token`` says so (llama.cpp's
  default for the tokenizer type when the field is absent), EOS likewise, as ``llama-server`` does.

BOS is part of the comparison, not stripped from it: a folder whose tokenizer leaves out the BOS llama.cpp
adds (or adds one llama.cpp does not) differs at token 0, and is refused like any other difference, since
the served model would see another prompt. The ids must be equal, and ``decode(encode(text))`` without
special tokens must give the text back. Otherwise the conversion is refused with one line naming the first
differing token (position, both ids and their strings).

The tokenizer itself is rebuilt from the GGUF's fields where the converter can do so faithfully, so it does
not depend on the transformers version: ``tokenizer.ggml.model == "llama"`` (SentencePiece BPE: Llama-2,
Gemma, Mistral v1…) from the tokens, scores and token types. ``"gpt2"`` (byte-level BPE with merges:
SmolLM2, Llama-3, Qwen…) comes from transformers' GGUF reader, and the check decides. Any other type is
refused. No pytest, torch or transformers at import time.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pytest_kvcache.engines.llamacpp_build import BuildError, cached_tokenize, ensure_tokenize
from pytest_kvcache.jsonio import file_sha256

#: gguf token types (``gguf.TokenType``).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
#: The tokenizer types the converter handles: rebuilt from the GGUF's fields, or taken from transformers.
REBUILT = {"llama": "SentencePiece BPE (tokens + scores), rebuilt from the GGUF"}
FROM_TRANSFORMERS = {"gpt2": "byte-level BPE (tokens + merges), from transformers' GGUF reader"}
BUILD_HINT = "python -m pytest_kvcache.engines.llamacpp_build llama-tokenize"
SPACE = "\u2581"  # SentencePiece's "▁"


class TokenizerRefused(RuntimeError):
    """The converted tokenizer is not the GGUF's, or cannot be checked: one line, the model is not served."""


def sample_text() -> str:
    """The fixed multilingual sample both tokenizers must agree on."""
    return resources.files("pytest_kvcache").joinpath("data/tokenizer/sample.txt").read_text(encoding="utf-8")


def recorded() -> dict[str, dict[str, Any]]:
    """llama.cpp's ids for the sample, recorded once for GGUFs whose bytes the plugin pins (the embedded model's),
    by GGUF sha256 (``data/tokenizer/recorded.json``; the engine tier holds them to a live ``llama-tokenize``)."""
    text = resources.files("pytest_kvcache").joinpath("data/tokenizer/recorded.json").read_text(encoding="utf-8")
    return dict(json.loads(text))


def recorded_ids(gguf: Path, text: str) -> list[int] | None:
    """The recorded llama.cpp ids of ``text`` for this exact GGUF (its size, then its sha256), else None: a
    conversion of a pinned GGUF is checked against them without a llama.cpp build."""
    try:
        size = gguf.stat().st_size
    except OSError:
        return None
    sample = hashlib.sha256(text.encode("utf-8")).hexdigest()
    candidates = {d: e for d, e in recorded().items() if e.get("size") == size and e.get("sample_sha256") == sample}
    if not candidates:
        return None
    stat = gguf.stat()
    entry = candidates.get(_digest(str(gguf), stat.st_size, stat.st_mtime_ns))
    return [int(i) for i in entry["ids"]] if entry is not None else None


@functools.lru_cache(maxsize=8)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    """A GGUF's sha256, once per file version: a conversion asks for it up to three times (plan, check, note)."""
    return file_sha256(Path(path))


def needs_llama_tokenize(gguf: Path) -> bool:
    """Whether checking ``gguf``'s converted tokenizer needs llama.cpp's ``llama-tokenize`` (no recorded ids)."""
    return recorded_ids(gguf, sample_text()) is None


@dataclass
class GgufVocab:
    """The tokenizer fields of a GGUF (``tokenizer.ggml.*``)."""

    model: str
    tokens: list[str]
    types: list[int]
    scores: list[float] = field(default_factory=list)
    merges: list[str] = field(default_factory=list)
    pre: str = ""
    bos_id: int | None = None
    eos_id: int | None = None
    unk_id: int | None = None
    pad_id: int | None = None
    add_bos: bool | None = None
    add_eos: bool | None = None
    add_space_prefix: bool | None = None
    chat_template: str | None = None

    def piece(self, token_id: int) -> str:
        return self.tokens[token_id] if 0 <= token_id < len(self.tokens) else f"<id {token_id}>"


#: GGUF metadata value types (the GGUF spec's ``gguf_type``): struct format of the scalar ones.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def read_metadata(gguf: Path, prefix: str = "") -> dict[str, Any]:
    """The GGUF's metadata (key → value; arrays as lists) whose keys start with ``prefix``, read from the
    header only: the tensors are neither parsed nor read. (``gguf.GGUFReader`` parses every tensor and every
    array element into numpy parts: ten seconds for Gemma-3's 262,144 tokens, against a fraction of one.)"""
    import mmap
    import struct

    import numpy as np

    def fail(why: str) -> TokenizerRefused:
        return TokenizerRefused(f"{gguf.name} is not a GGUF this converter reads ({why}); the model is not served")

    try:
        fh = gguf.open("rb")
    except OSError as exc:
        raise TokenizerRefused(f"cannot read {gguf}: {exc.strerror}; the model is not served") from None
    with fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise fail("no GGUF magic")
        version, _n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise fail(f"version {version}")
        pos = 24

        def string() -> str:
            nonlocal pos
            (n,) = struct.unpack_from("<Q", buf, pos)
            text = buf[pos + 8 : pos + 8 + n].decode("utf-8", errors="replace")
            pos += 8 + n
            return text

        def value(kind: int, keep: bool) -> Any:
            nonlocal pos
            if kind == _STRING:
                return string()
            if kind in _SCALARS:
                fmt = "<" + _SCALARS[kind]
                (v,) = struct.unpack_from(fmt, buf, pos)
                pos += struct.calcsize(fmt)
                return v
            if kind != _ARRAY:
                raise fail(f"metadata type {kind}")
            elem, count = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            if elem in _SCALARS:
                size = struct.calcsize(_SCALARS[elem])
                data = np.frombuffer(buf, dtype="<" + _SCALARS[elem], count=count, offset=pos) if keep else None
                pos += size * count
                return data.tolist() if data is not None else None
            return [value(elem, keep) for _ in range(count)]

        found: dict[str, Any] = {}
        for _ in range(n_kv):
            key = string()
            (kind,) = struct.unpack_from("<I", buf, pos)
            pos += 4
            keep = key.startswith(prefix)
            v = value(kind, keep)
            if keep:
                found[key] = v
        return found


def read_vocab(gguf: Path) -> GgufVocab:
    """The GGUF's tokenizer fields (``tokenizer.*``), read from its header."""
    fields = read_metadata(gguf, "tokenizer.")
    model = fields.get("tokenizer.ggml.model")
    if model is None:
        raise TokenizerRefused(f"{gguf.name} has no tokenizer (no tokenizer.ggml.model); the model is not served")
    return GgufVocab(
        model=str(model),
        tokens=list(fields.get("tokenizer.ggml.tokens", [])),
        types=[int(t) for t in fields.get("tokenizer.ggml.token_type", [])],
        scores=[float(x) for x in fields.get("tokenizer.ggml.scores", [])],
        merges=list(fields.get("tokenizer.ggml.merges", [])),
        pre=str(fields.get("tokenizer.ggml.pre") or ""),
        bos_id=fields.get("tokenizer.ggml.bos_token_id"),
        eos_id=fields.get("tokenizer.ggml.eos_token_id"),
        unk_id=fields.get("tokenizer.ggml.unknown_token_id"),
        pad_id=fields.get("tokenizer.ggml.padding_token_id"),
        add_bos=fields.get("tokenizer.ggml.add_bos_token"),
        add_eos=fields.get("tokenizer.ggml.add_eos_token"),
        add_space_prefix=fields.get("tokenizer.ggml.add_space_prefix"),
        chat_template=fields.get("tokenizer.chat_template"),
    )


def spm_merges(vocab: GgufVocab) -> list[tuple[str, str]]:
    """BPE merges equivalent to llama.cpp's SentencePiece tokenizer: it repeatedly joins the adjacent pair of
    symbols whose concatenation is a token with the highest score. Every split ``(a, b)`` of a normal token
    whose halves are tokens becomes a merge, ranked by the joined token's score (higher first), then by the
    halves' ids (ties are rare: the scores are the pieces' ranks)."""
    ids = {piece: i for i, piece in enumerate(vocab.tokens)}
    ranked: list[tuple[float, int, int, str, str]] = []
    for token_id, piece in enumerate(vocab.tokens):
        if vocab.types[token_id] not in (NORMAL, UNUSED) or len(piece) < 2:
            continue
        score = vocab.scores[token_id]
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            left_id, right_id = ids.get(left), ids.get(right)
            if left_id is not None and right_id is not None:
                ranked.append((-score, left_id, right_id, left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


def spm_tokenizer(vocab: GgufVocab) -> Any:
    """A ``tokenizers.Tokenizer`` equal to llama.cpp's for a SentencePiece-BPE GGUF
    (``tokenizer.ggml.model == "llama"``): BPE over the tokens with :func:`spm_merges`, byte fallback to
    the ``<0xNN>`` tokens, spaces as ``▁`` (and one prepended when ``add_space_prefix``), control and
    user-defined tokens matched in the raw text before the BPE (as llama.cpp partitions them out), BOS/EOS
    as ``add_bos_token``/``add_eos_token`` say (llama.cpp's defaults for this type: BOS yes, EOS no)."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
    from tokenizers.models import BPE

    if not vocab.tokens or len(vocab.scores) != len(vocab.tokens) or len(vocab.types) != len(vocab.tokens):
        raise TokenizerRefused(
            "the GGUF's SentencePiece tokenizer lacks its tokens, scores or token types; the model is not served"
        )
    unk = vocab.piece(vocab.unk_id) if vocab.unk_id is not None else None
    model = BPE(
        vocab={piece: i for i, piece in enumerate(vocab.tokens)},
        merges=spm_merges(vocab),
        unk_token=unk,
        byte_fallback=True,
        fuse_unk=True,
    )
    tok = Tokenizer(model)
    steps = ([normalizers.Prepend(SPACE)] if vocab.add_space_prefix else []) + [normalizers.Replace(" ", SPACE)]
    tok.normalizer = normalizers.Sequence(steps)
    tok.pre_tokenizer = None
    strip = [decoders.Strip(" ", 1, 0)] if vocab.add_space_prefix else []
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(), *strip])
    special = [
        AddedToken(piece, special=True, normalized=False)
        for piece, kind in zip(vocab.tokens, vocab.types, strict=True)
        if kind in (CONTROL, UNKNOWN)
    ]
    user = [
        AddedToken(piece, special=False, normalized=False)
        for piece, kind in zip(vocab.tokens, vocab.types, strict=True)
        if kind == USER_DEFINED
    ]
    tok.add_special_tokens(special)
    tok.add_tokens(user)
    add_bos = True if vocab.add_bos is None else bool(vocab.add_bos)  # llama.cpp's default for SPM
    add_eos = bool(vocab.add_eos)
    single: list[str] = []
    specials: list[tuple[str, int]] = []
    if add_bos and vocab.bos_id is not None:
        single.append(vocab.piece(vocab.bos_id))
        specials.append((vocab.piece(vocab.bos_id), vocab.bos_id))
    single.append("$A")
    if add_eos and vocab.eos_id is not None:
        single.append(vocab.piece(vocab.eos_id))
        specials.append((vocab.piece(vocab.eos_id), vocab.eos_id))
    pair = [*single, *("$B:1" if s == "$A" else f"{s}:1" for s in single)]
    tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)
    return tok


def hf_tokenizer(vocab: GgufVocab, gguf: Path, *, source: str = "auto") -> Any:
    """The tokenizer the converter writes into the folder (a transformers tokenizer object).

    ``source``: ``auto`` rebuilds what :data:`REBUILT` lists and takes :data:`FROM_TRANSFORMERS` from
    transformers; ``transformers`` always takes transformers' (what the converter did before: kept to show
    the check refusing it). Any other tokenizer type is refused."""
    if source == "auto" and vocab.model not in (*REBUILT, *FROM_TRANSFORMERS):
        known = ", ".join(f"'{k}'" for k in (*REBUILT, *FROM_TRANSFORMERS))
        raise TokenizerRefused(
            f"{gguf.name} has a '{vocab.model}' tokenizer (tokenizer.ggml.model), which the converter does not "
            f"rebuild (it converts {known}); the model is not served"
        )
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if source == "auto" and vocab.model in REBUILT:

        def piece(token_id: int | None) -> str | None:
            return vocab.piece(token_id) if token_id is not None else None

        return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
            tokenizer_object=spm_tokenizer(vocab),
            bos_token=piece(vocab.bos_id),
            eos_token=piece(vocab.eos_id),
            unk_token=piece(vocab.unk_id),
            pad_token=piece(vocab.pad_id),
            clean_up_tokenization_spaces=False,
            **({"chat_template": vocab.chat_template} if vocab.chat_template else {}),
        )
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def find_llama_tokenize(*, build: bool = False) -> Path:
    """llama.cpp's ``llama-tokenize``: the plugin's cached build, else one on PATH, else (``build``, with cmake
    and a C++ compiler) built now into the cache, as a missing llama-server is (about 6-9 minutes on 2 cores,
    once; a concurrent build of it is waited for). TokenizerRefused (one line, saying how to build it) when
    there is none: the check is never skipped."""
    import os

    if found := cached_tokenize():
        return found
    if on_path := shutil.which("llama-tokenize"):
        return Path(on_path)
    can_build = shutil.which("cmake") is not None and shutil.which(os.environ.get("CXX", "c++")) is not None
    if build and can_build:
        try:
            return ensure_tokenize(on_build=lambda msg: print(msg, file=sys.stderr, flush=True))
        except BuildError as exc:
            first = str(exc).splitlines()[0]
            raise TokenizerRefused(
                f"the converted tokenizer is checked against llama.cpp's llama-tokenize, whose build failed "
                f"({first}); the model is not served"
            ) from None
    raise TokenizerRefused(
        "the converted tokenizer is checked against llama.cpp's llama-tokenize, which is not built: run "
        f"`{BUILD_HINT}` (about 9 minutes on 2 cores, once; needs cmake and a C++ compiler); the model is not served"
    )


def llama_ids(binary: Path, gguf: Path, text: str) -> list[int]:
    """``text`` tokenized by llama.cpp with the GGUF's vocabulary (its BOS/EOS policy, special tokens parsed,
    no escape processing)."""
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt", delete=False) as fh:
        fh.write(text)
        path = Path(fh.name)
    try:
        argv = [str(binary), "-m", str(gguf), "-f", str(path), "--ids", "--no-escape", "--log-disable"]
        proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    finally:
        path.unlink(missing_ok=True)
    out = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not out or not out[-1].startswith("["):
        lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
        why = lines[-1].strip() if lines else f"exit code {proc.returncode}"
        raise TokenizerRefused(f"llama-tokenize could not tokenize with {gguf.name} ({why}); the model is not served")
    body = out[-1].strip().removeprefix("[").removesuffix("]")
    return [int(x) for x in body.split(",") if x.strip()]


def first_difference(ours: Sequence[int], theirs: Sequence[int]) -> int | None:
    """The position of the first differing token (a shorter list differs where it ends), None when equal."""
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return i
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def _shown(ids: list[int], pos: int, piece: Any) -> str:
    if pos >= len(ids):
        return "the end"
    return f"{piece(ids[pos])!r} {ids[pos]}"


def mismatch_message(
    converted: list[int], own: list[int], converted_piece: Any, own_piece: Any, *, what: str = "the sample"
) -> str | None:
    """One line naming the first token where the converted tokenizer leaves the GGUF's own; None if equal."""
    pos = first_difference(converted, own)
    if pos is None:
        return None
    return (
        f"the converted tokenizer differs from the GGUF's own at token {pos} of {what} "
        f"({_shown(converted, pos, converted_piece)} vs {_shown(own, pos, own_piece)}; "
        f"{len(converted)} vs {len(own)} tokens); the model is not served"
    )


@dataclass(frozen=True)
class CheckResult:
    tokens: int
    seconds: float


def check_folder(
    folder: Path, gguf: Path, vocab: GgufVocab, binary: Path | None, *, text: str | None = None
) -> CheckResult:
    """The folder's tokenizer (loaded as vLLM loads it) against llama.cpp's on ``gguf``: the same ids, with
    each side's special tokens, and a lossless round trip. TokenizerRefused (one line) otherwise. llama.cpp's ids
    are the recorded ones for a pinned GGUF when ``binary`` is None (`recorded_ids`), else ``binary``'s."""
    from transformers import AutoTokenizer

    started = time.monotonic()
    text = sample_text() if text is None else text
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    converted = list(tokenizer.encode(text, add_special_tokens=True))
    own = recorded_ids(gguf, text) if binary is None else None
    if own is None:
        own = llama_ids(binary or find_llama_tokenize(build=True), gguf, text)

    def converted_piece(token_id: int) -> str:
        return str(tokenizer.convert_ids_to_tokens(token_id))

    if message := mismatch_message(converted, own, converted_piece, vocab.piece):
        raise TokenizerRefused(message)
    plain = list(tokenizer.encode(text, add_special_tokens=False))
    back = tokenizer.decode(plain, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if back != text:
        pos = next((i for i, (a, b) in enumerate(zip(back, text, strict=False)) if a != b), min(len(back), len(text)))
        raise TokenizerRefused(
            f"the converted tokenizer does not give the sample back: decode(encode(text)) differs at character "
            f"{pos} ({back[pos : pos + 12]!r} vs {text[pos : pos + 12]!r}); the model is not served"
        )
    return CheckResult(tokens=len(own), seconds=time.monotonic() - started)


def convert_tokenizer(gguf: Path, out: Path, *, binary: Path | None = None, source: str = "auto") -> CheckResult:
    """Write the GGUF's tokenizer into ``out`` and check it (TokenizerRefused: one line). Without ``binary``: the
    recorded ids of a pinned GGUF, else the cached (or now built) ``llama-tokenize``."""
    if binary is None and needs_llama_tokenize(gguf):
        binary = find_llama_tokenize(build=True)  # before anything is written: no tool, no conversion
    vocab = read_vocab(gguf)
    tokenizer = hf_tokenizer(vocab, gguf, source=source)
    tokenizer.save_pretrained(str(out))
    return check_folder(out, gguf, vocab, binary)


def main(argv: list[str] | None = None) -> int:
    """``python -m pytest_kvcache.engines.tokenizer_check --gguf FILE``: convert only the tokenizer (into a
    temporary folder) and check it against llama.cpp's; one line either way."""
    parser = argparse.ArgumentParser(prog="python -m pytest_kvcache.engines.tokenizer_check")
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--llama-tokenize", type=Path, default=None)
    parser.add_argument("--tokenizer", choices=("auto", "transformers"), default="auto")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="kv-tokenizer-") as tmp:
            result = convert_tokenizer(args.gguf, Path(tmp), binary=args.llama_tokenize, source=args.tokenizer)
    except TokenizerRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    print(
        f"ok: {args.gguf.name}: the converted tokenizer gives llama.cpp's {result.tokens} ids for the sample and "
        f"decodes it back (check {result.seconds:.1f} s, {time.monotonic() - started:.1f} s in all)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
