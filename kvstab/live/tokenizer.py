"""The emulator's tokenizer as a Hugging Face tokenizer folder, for clients that count tokens themselves.

``kvstab serve --emulate`` counts one token per whitespace-separated word
(:mod:`kvstab.live.server`).  Load generators (``vllm bench serve``, AIPerf,
GuideLLM) build their prompts with a tokenizer of their own and record the
lengths it counts; pointed at :func:`write_tokenizer`'s folder, their counts
and the emulator's agree token for token, so the lengths in their result files
are the lengths the emulator served.  The folder is written locally with the
``tokenizers`` package (a word-level model split on whitespace, no
post-processor, so no special token is added to a prompt): nothing comes from
the Hugging Face hub.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvstab.errors import InvalidArgument

__all__ = ["write_tokenizer", "WORDS", "SPECIAL_TOKENS", "UNKNOWN"]

#: the special tokens, ids 0 and 1 (clients leave special ids out of random prompts)
SPECIAL_TOKENS = ("<s>", "</s>")
#: any word outside the vocabulary: an ordinary word, not a special token, so that text made of
#: arbitrary words (GuideLLM's synthetic prompts) keeps one token per word through encode and decode
UNKNOWN = "unk"
#: ordinary words: the unknown word, what the emulator generates (``tok``), then ``w0 … w{n}``
WORDS = 4096


def write_tokenizer(folder: str | Path, words: int = WORDS) -> Path:
    """Write a word-level tokenizer (``tokenizer.json``, ``tokenizer_config.json``) to ``folder``.

    Any text encodes to one id per whitespace-separated word (a word outside
    the vocabulary is :data:`UNKNOWN`, an ordinary token) and decodes to as many
    words joined by spaces, so a client's decode-then-encode length adjustment
    lands on its target at once."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if words < 2:
        raise InvalidArgument(f"the tokenizer needs at least two words (unk, tok), got {words}")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for w in [UNKNOWN, "tok", *(f"w{k}" for k in range(words - 2))]:
        vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNKNOWN))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # WordPiece's decoder joins tokens with spaces (no '##' pieces occur in this vocabulary)
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL_TOKENS[0], "eos_token": SPECIAL_TOKENS[1], "model_max_length": 1_000_000, "clean_up_tokenization_spaces": False,
        "add_bos_token": False, "add_eos_token": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": SPECIAL_TOKENS[0], "eos_token": SPECIAL_TOKENS[1]}, indent=2
    ) + "\n")
    return out
