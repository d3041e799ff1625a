"""English text for the language model: the King James Bible (Debian's
bible-kjv and bible-kjv-text; the text is in the public domain), as bytes.

The `bible` program prints the whole text (4.3 MB, ASCII); each of its
1,189 chapters becomes "Book N" and one line per verse. Every 20th chapter
(the 11th, 31st, ...: 59 chapters, 196 kB or 4.7% of the bytes, spread over the whole
book) is the validation text, which no node trains on; the other chapters
are dealt out to the nodes in turn, so every node gets a spread of books.
"""

import functools
import re
import subprocess

import numpy as np

HELD_OUT_EVERY = 20  # every 20th chapter is validation text
_VERSE = re.compile(r"^\s+\d+ (.*)$")


@functools.lru_cache(maxsize=None)
def chapters():
    """The chapters of the King James Bible, in order, each a str."""
    try:
        text = subprocess.run(["bible", "-l", "100000", "Gen1:1-Rev22:21"], check=True,
                              capture_output=True, text=True).stdout
    except FileNotFoundError:
        raise SystemExit("corpus: `bible` not found: apt-get install bible-kjv bible-kjv-text "
                         "(scripts/bootstrap installs them)") from None
    found, current = [], None
    for line in text.splitlines():
        verse = _VERSE.match(line)
        if verse and current is not None:
            current.append(verse.group(1))
        elif line.strip():  # a heading: "Genesis 1"
            current = [line.strip()]
            found.append(current)
    if len(found) != 1189:
        raise SystemExit(f"corpus: expected 1,189 chapters from `bible`, found {len(found)}")
    return tuple("\n".join(lines) + "\n\n" for lines in found)


def _bytes(parts):
    return np.frombuffer("".join(parts).encode("ascii"), dtype=np.uint8)


def validation():
    """The held-out text (uint8 bytes): no node trains on it."""
    return _bytes(c for k, c in enumerate(chapters()) if k % HELD_OUT_EVERY == HELD_OUT_EVERY // 2)


def training(node=0, nodes=1):
    """Node `node`'s share of the training text (uint8 bytes): every `nodes`-th
    training chapter from the `node`-th; nodes=1 is all of it."""
    if not 0 <= node < nodes:
        raise ValueError(f"node {node} is not in 0..{nodes - 1}")
    train = [c for k, c in enumerate(chapters()) if k % HELD_OUT_EVERY != HELD_OUT_EVERY // 2]
    return _bytes(train[node::nodes])


def batch(text, rng, batch_size, block):
    """(inputs, targets) int64 tensors batch_size x block: windows of `text` at
    positions drawn from `rng`, targets one byte on."""
    import torch
    starts = rng.integers(0, len(text) - block - 1, batch_size)
    windows = np.stack([text[s:s + block + 1] for s in starts]).astype(np.int64)
    windows = torch.from_numpy(windows)
    return windows[:, :-1], windows[:, 1:]
