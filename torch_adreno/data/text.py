"""The text corpus shipped for language-model fine-tuning, and the byte-level tokenizer that goes
with it (nothing can be downloaded at run time: no tokenizer files, no data sets).

``shakespeare.txt.gz``: 299,868 bytes of Shakespeare's *Coriolanus* and *Richard III* (public
domain); its provenance is in ``README.md`` beside it. Pure ASCII, so one byte is one character.
"""

from __future__ import annotations

import gzip
from importlib import resources

import torch

#: The corpus file in this package.
CORPUS_FILE = "shakespeare.txt.gz"


def load_corpus() -> bytes:
    """The bundled corpus, as bytes (UTF-8; all ASCII)."""
    with resources.files(__package__).joinpath(CORPUS_FILE).open("rb") as raw, gzip.open(raw, "rb") as f:
        return f.read()


class ByteTokenizer:
    """Token ids are the bytes of the UTF-8 text: a vocabulary of 256 ids, no files, no special
    tokens. Any byte sequence round-trips (``decode(encode(text)) == text`` for any str)."""

    vocab_size = 256
    name = "bytes"

    def encode(self, text: str | bytes) -> torch.Tensor:
        """The int64 ids (1-D) of ``text``."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)

    def decode(self, ids: torch.Tensor) -> str:
        """The text of ``ids`` (1-D, values 0..255); invalid UTF-8 shows as U+FFFD."""
        values = ids.detach().to("cpu", torch.int64)
        if values.numel() and (int(values.min()) < 0 or int(values.max()) > 255):
            raise ValueError(f"byte token ids are 0..255, got values from {int(values.min())} to {int(values.max())}")
        return bytes(values.to(torch.uint8).tolist()).decode("utf-8", errors="replace")
