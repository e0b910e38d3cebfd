"""The converted tokenizer's check against the GGUF's own, without an engine: the first-difference logic and
its one line, the SentencePiece rebuild (against a small reference of llama.cpp's algorithm, on a small GGUF
written here), the refusal path of the converter (one line, no folder), a missing llama-tokenize."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from pytest_kvcache.engines import tokenizer_check as tc
from pytest_kvcache.engines import trained_model as tm
from tests.factories import fake_llamacpp_sdist

needs_tokenizers = pytest.mark.skipif(
    importlib.util.find_spec("tokenizers") is None or importlib.util.find_spec("gguf") is None,
    reason="needs tokenizers and gguf (bash scripts/setup.sh)",
)

SP = tc.SPACE
#: A small SentencePiece vocabulary: (piece, score) of the normal tokens.
PIECES = [
    (SP, -1.0),
    *((c, -2.0 - i * 0.01) for i, c in enumerate("abcdehlorw")),
    ("he", -3.0),
    ("ll", -3.1),
    ("llo", -3.2),
    ("hello", -3.3),
    (f"{SP}hello", -3.4),
    (f"{SP}w", -3.5),
    ("or", -3.6),
    ("ld", -3.7),
    ("wor", -3.8),
    (f"{SP}world", -3.9),
    ("ab", -4.0),
    ("abc", -4.1),
    (f"{SP}{SP}", -4.2),
]


def small_vocab(*, add_space_prefix: bool = False, add_bos: bool | None = True) -> tc.GgufVocab:
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *(p for p, _ in PIECES), "<tab2>"]
    types = [tc.UNKNOWN, tc.CONTROL, tc.CONTROL, *[tc.BYTE] * 256, *[tc.NORMAL] * len(PIECES), tc.USER_DEFINED]
    scores = [0.0, 0.0, 0.0, *[0.0] * 256, *(s for _, s in PIECES), 0.0]
    return tc.GgufVocab(
        model="llama",
        tokens=tokens,
        types=types,
        scores=scores,
        bos_id=1,
        eos_id=2,
        unk_id=0,
        add_bos=add_bos,
        add_space_prefix=add_space_prefix,
    )


def reference_spm(vocab: tc.GgufVocab, text: str) -> list[int]:
    """llama.cpp's SentencePiece tokenizer (llm_tokenizer_spm), for a text without special tokens: spaces as
    ▁ (one prepended with add_space_prefix), then repeatedly join the adjacent pair whose concatenation is a
    token with the highest score (leftmost on a tie); a symbol that is no token falls back to its bytes."""
    ids = {piece: i for i, piece in enumerate(vocab.tokens)}
    text = (" " if vocab.add_space_prefix else "") + text
    symbols = list(text.replace(" ", SP))
    while True:
        best: tuple[float, int] | None = None
        for i in range(len(symbols) - 1):
            joined = symbols[i] + symbols[i + 1]
            if joined in ids and (best is None or vocab.scores[ids[joined]] > best[0]):
                best = (vocab.scores[ids[joined]], i)
        if best is None:
            break
        i = best[1]
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
    out = [vocab.bos_id] if vocab.add_bos is not False and vocab.bos_id is not None else []
    for s in symbols:
        if s in ids:
            out.append(ids[s])
        else:
            out.extend(ids[f"<0x{b:02X}>"] for b in s.encode())
    return [i for i in out if i is not None]


def test_the_sample_covers_the_scripts_and_the_whitespace() -> None:
    text = tc.sample_text()
    assert 1500 < len(text.encode()) < 8000
    for needle in ("Grüße", "Où", "Привет", "Καλημέρα", "我能", "ガラス", "안녕하세요", "مرحبا", "नमस्ते", "👍🏽"):
        assert needle in text, needle
    assert "\n\tdef __init__" in text and "\t\tself" in text and "    return b" in text
    assert "a  b   c    d" in text and "\n\n\n" in text and "1234567" in text


def test_first_difference() -> None:
    assert tc.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert tc.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert tc.first_difference([1, 2], [1, 2, 3]) == 2
    assert tc.first_difference([], [7]) == 0
    assert tc.first_difference([], []) is None


def test_a_mismatch_is_one_line_naming_the_first_differing_token() -> None:
    ours = {9: "▁Grüße", 5: "▁a"}
    theirs = {38: "G", 5: "▁a"}
    line = tc.mismatch_message([5, 5, 5, 9, 4], [5, 5, 5, 38, 1, 2], ours.get, theirs.get)
    assert line == (
        "the converted tokenizer differs from the GGUF's own at token 3 of the sample ('▁Grüße' 9 vs 'G' 38; "
        "5 vs 6 tokens); the model is not served"
    )
    assert tc.mismatch_message([1, 2], [1, 2], str, str) is None
    short = tc.mismatch_message([1, 2], [1, 2, 3], str, str)
    assert short is not None and "at token 2 of the sample (the end vs '3' 3" in short and "\n" not in short


@needs_tokenizers
@pytest.mark.parametrize("add_space_prefix", [False, True])
def test_the_sentencepiece_rebuild_tokenizes_as_llamacpp(add_space_prefix: bool) -> None:
    vocab = small_vocab(add_space_prefix=add_space_prefix)
    tok = tc.spm_tokenizer(vocab)
    for text in ("hello world", "hello  world", "abcab world", "hellé wörld ✓", " hello", "a\tb"):
        want = reference_spm(vocab, text)
        assert tok.encode(text).ids == want, (text, tok.encode(text).tokens)
        assert tok.decode(tok.encode(text, add_special_tokens=False).ids, skip_special_tokens=False) == text
    assert tok.encode("hello").ids[0] == 1  # BOS, as add_bos_token says (the default for SentencePiece)
    assert tc.spm_tokenizer(small_vocab(add_bos=False)).encode("hello").ids == [vocab.tokens.index("hello")]
    # special and user-defined tokens are matched in the raw text before the BPE, as llama.cpp partitions them
    # (with add_space_prefix, each stretch of text after one gets its own ▁, as in llama.cpp)
    plain = [reference_spm(small_vocab(add_space_prefix=add_space_prefix, add_bos=False), t) for t in ("hello", "ab")]
    want = [1, *plain[0], 2, *plain[1], vocab.tokens.index("<tab2>")]
    assert tok.encode("hello</s>ab<tab2>").ids == want


@needs_tokenizers
def test_a_character_level_tokenizer_is_named_at_its_first_token() -> None:
    """What transformers 5.17 made of Gemma-3's vocabulary: the tokens without merges, one per character."""
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    vocab = small_vocab()
    good = tc.spm_tokenizer(vocab)
    broken = Tokenizer(BPE(vocab={p: i for i, p in enumerate(vocab.tokens)}, merges=[], byte_fallback=True))
    text = "hello world"
    line = tc.mismatch_message(
        broken.encode(text).ids, good.encode(text).ids, broken.id_to_token, vocab.piece, what="the sample"
    )
    assert line is not None and line.startswith("the converted tokenizer differs from the GGUF's own at token 0 ")
    assert "('h' " in line and "'<s>' 1" in line and line.endswith("the model is not served")


def test_an_unsupported_tokenizer_type_is_refused_in_one_line(tmp_path: Path) -> None:
    vocab = tc.GgufVocab(model="t5", tokens=["<pad>"], types=[tc.CONTROL])
    with pytest.raises(tc.TokenizerRefused) as info:
        tc.hf_tokenizer(vocab, tmp_path / "m.gguf")
    assert str(info.value) == (
        "m.gguf has a 't5' tokenizer (tokenizer.ggml.model), which the converter does not rebuild (it converts "
        "'llama', 'gpt2'); the model is not served"
    )


def test_no_llama_tokenize_says_how_to_build_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(tc.TokenizerRefused) as info:
        tc.find_llama_tokenize()
    line = str(info.value)
    assert "\n" not in line and "`python -m pytest_kvcache.engines.llamacpp_build llama-tokenize`" in line


def fake_tokenize(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "llama-tokenize"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_llama_tokenize_output_is_read_and_its_failure_is_one_line(tmp_path: Path) -> None:
    ok = fake_tokenize(tmp_path, 'echo "some log"; echo "[2, 818, 3823]"')
    assert tc.llama_ids(ok, tmp_path / "m.gguf", "text") == [2, 818, 3823]
    bad = fake_tokenize(tmp_path, 'echo "error: could not load model" >&2; exit 1')
    with pytest.raises(tc.TokenizerRefused, match=r"^llama-tokenize could not tokenize with m.gguf \(error: could"):
        tc.llama_ids(bad, tmp_path / "m.gguf", "text")


def write_small_gguf(path: Path, vocab: tc.GgufVocab) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model(vocab.model)
    writer.add_token_list(vocab.tokens)
    writer.add_token_scores(vocab.scores)
    writer.add_token_types(vocab.types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@needs_tokenizers
def test_convert_tokenizer_writes_a_folder_vllm_loads_and_checks_it(tmp_path: Path) -> None:
    """The whole path on a small GGUF: read its fields, rebuild, save, load back as vLLM does, compare with
    a stand-in llama-tokenize that prints the reference ids; a wrong one is refused in one line."""
    pytest.importorskip("transformers")
    vocab = small_vocab()
    gguf = write_small_gguf(tmp_path / "small.gguf", vocab)
    read = tc.read_vocab(gguf)
    assert read.tokens == vocab.tokens and read.types == vocab.types and read.add_bos is True
    text = "hello world abc"
    want = reference_spm(vocab, text)
    binary = fake_tokenize(tmp_path, f'echo "[{", ".join(map(str, want))}]"')
    out = tmp_path / "folder"
    tokenizer = tc.hf_tokenizer(read, gguf)
    tokenizer.save_pretrained(str(out))
    assert tc.check_folder(out, gguf, read, binary, text=text).tokens == len(want)
    wrong = fake_tokenize(tmp_path, f'echo "[{", ".join(map(str, [*want[:2], 7, *want[3:]]))}]"')
    with pytest.raises(tc.TokenizerRefused) as info:
        tc.check_folder(out, gguf, read, wrong, text=text)
    assert str(info.value).startswith("the converted tokenizer differs from the GGUF's own at token 2 of the sample")


def test_a_refused_conversion_leaves_no_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise tc.TokenizerRefused("the converted tokenizer differs from the GGUF's own at token 0 …")

    monkeypatch.setattr(tc, "convert_tokenizer", refuse)
    out = tmp_path / "out"
    code = tm.main(["--gguf", str(tmp_path / "m.gguf"), "--out", str(out), "--llama-tokenize", "/bin/true"])
    assert code == tm.REFUSED and not out.exists()


def test_the_cache_reports_a_refusal_as_its_one_line(tmp_path: Path) -> None:
    """The conversion child exits with REFUSED and its line: the cache raises it as it is (no install hint),
    and nothing is cached."""
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    shim = tmp_path / "python"
    shim.write_text(
        '#!/bin/sh\nfor a; do case $prev in --out) mkdir -p "$a";; esac; prev=$a; done\n'
        'echo "error: the converted tokenizer differs from the GGUF\'s own at token 0 of the sample" >&2\n'
        f"exit {tm.REFUSED}\n"
    )
    shim.chmod(0o755)
    with pytest.raises(tm.TrainedModelError) as info:
        tm._convert_in_child(gguf, tmp_path / "out", str(shim))
    assert str(info.value) == "m.gguf: the converted tokenizer differs from the GGUF's own at token 0 of the sample"


def test_llama_tokenize_is_a_build_of_its_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """llama-tokenize has its own build key (the server's is unchanged: every cached server stays valid), and
    is built like the server: the pinned sdist's llama.cpp, one cmake target, moved into the cache at the end."""
    import os

    from pytest_kvcache.engines import llamacpp_build as build

    assert build.build_key() == build.build_key(build.TARGET) != build.build_key(build.TOKENIZE_TARGET)
    fake_llamacpp_sdist(tmp_path, monkeypatch)
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    cmake = bin_dir / "cmake"
    cmake.write_text(  # configure: nothing; build: write the binary of the target it was asked for
        '#!/bin/sh\nif [ "$1" = "-S" ]; then exit 0; fi\n'
        'mkdir -p "$2/bin" && printf "#!/bin/sh\\n" > "$2/bin/$4" && chmod +x "$2/bin/$4"\n'
    )
    cmake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    root = tmp_path / "cache"
    said: list[str] = []
    found = build.ensure_tokenize(root, on_build=said.append)
    assert found == root / build.build_key(build.TOKENIZE_TARGET) / "bin" / "llama-tokenize"
    assert build.cached_tokenize(root) == found and build.cached_server(root) is None
    version = build.SDIST_VERSION
    assert said == [f"building llama-tokenize (llama.cpp from llama-cpp-python {version}) into {found.parents[1]}"]
    assert build.main(["llama-bogus"]) == 2


def test_a_pinned_gguf_is_checked_against_its_recorded_ids_and_any_other_needs_llama_tokenize(tmp_path: Path) -> None:
    """The embedded model's GGUF has llama.cpp's ids recorded (its conversion needs no llama.cpp build); a GGUF of
    other bytes, or another sample, has none."""
    from pytest_kvcache.engines.trained_model import verified_gguf

    gguf = verified_gguf()
    ids = tc.recorded_ids(gguf, tc.sample_text())
    assert ids is not None and len(ids) == 1054 and not tc.needs_llama_tokenize(gguf)
    assert tc.recorded_ids(gguf, tc.sample_text() + " ") is None
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF" + b"\0" * 64)
    assert tc.recorded_ids(other, tc.sample_text()) is None and tc.needs_llama_tokenize(other)
