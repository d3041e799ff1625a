"""Fashion-MNIST from Debian's dataset-fashion-mnist package, read with numpy.

Nothing is downloaded: the IDX files come from
/usr/share/datasets/fashion-mnist/ (apt-get install dataset-fashion-mnist).
"""

import gzip
import os

import numpy as np

FOLDER = "/usr/share/datasets/fashion-mnist"


def _idx(path):
    """One IDX file (big-endian header: magic, then one size per dimension)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError("%s: not an IDX file of unsigned bytes" % path)
    rank = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(rank))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * rank)
    if data.size != int(np.prod(shape)):
        raise ValueError("%s: header says %s, file holds %d values" % (path, shape, data.size))
    return data.reshape(shape)


def load(split, folder=FOLDER):
    """(images float32 N x 1 x 28 x 28 in [0, 1], labels int64 N) of 'train' or 't10k'."""
    images = _idx(os.path.join(folder, "%s-images-idx3-ubyte.gz" % split))
    labels = _idx(os.path.join(folder, "%s-labels-idx1-ubyte.gz" % split))
    if len(images) != len(labels):
        raise ValueError("%s: %d images but %d labels" % (split, len(images), len(labels)))
    return images.astype(np.float32)[:, None] / 255.0, labels.astype(np.int64)
