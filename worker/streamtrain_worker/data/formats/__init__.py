"""Line formats: each turns raw bytes into ``Batch`` blocks with one numba kernel.

``make_format(config)`` picks the format named by ``DataConfig.format``; every format follows
the ``kernel.Format`` protocol and the hashing scheme of ``data.hashing``.
"""

from __future__ import annotations

import numpy as np

from streamtrain_worker.data.config import DataConfig
from streamtrain_worker.data.crosses import CrossedFormat
from streamtrain_worker.data.formats.avazu import AvazuFormat
from streamtrain_worker.data.formats.criteo import CriteoFormat
from streamtrain_worker.data.formats.generic_csv import CsvFormat
from streamtrain_worker.data.formats.kernel import REASONS, Format, ParsedBlock
from streamtrain_worker.data.formats.libsvm import LibsvmFormat
from streamtrain_worker.data.formats.slot import SlotFormat

__all__ = ["REASONS", "Format", "ParsedBlock", "line_format", "make_format"]


def make_format(config: DataConfig, labels_optional: bool = False) -> Format:
    """The parser for ``config.format`` (loads the libSVM field map, if any, once), with
    ``config.crosses`` appended to its slots.

    ``labels_optional`` (scoring, not training): a slot line without its label token is an
    example with a NaN label instead of a bad line; other formats keep the label required.
    """
    fmt = line_format(config, labels_optional)
    names = getattr(fmt, "slot_names", None) or config.slot_names
    pairs = config.crossed_positions(tuple(names))
    if not pairs:
        return fmt
    positions = np.array(pairs, dtype=np.int64)
    return CrossedFormat(fmt, positions, single_keys=config.crosses_single_keys)


def line_format(config: DataConfig, labels_optional: bool = False) -> Format:
    """The parser of ``config.format`` alone: the slots of the lines, no crossed slots."""
    if config.format == "criteo":
        return CriteoFormat()
    if config.format == "avazu":
        return AvazuFormat(config)
    if config.format == "csv":
        return CsvFormat(config)
    if config.format == "libsvm":
        return LibsvmFormat(config)
    return SlotFormat(config, labels_optional)
